//! A minimal HTTP/1.1 client over a TCP connection to 127.0.0.1: the runtime's probes
//! (etcd's `/health`, a server's `/readyz`) and `local apply`'s POST to the runtime. One
//! request per connection (`Connection: close`), the body read to the end; enough for these
//! local peers, which answer with a `Content-Length` body.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// `method path` to `addr` with `body`, within `timeout` (connecting included).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> std::io::Result<Response> {
    let call = async {
        let mut conn = TcpStream::connect(addr).await?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/yaml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        conn.write_all(head.as_bytes()).await?;
        conn.write_all(body.as_bytes()).await?;
        let mut raw = Vec::new();
        conn.read_to_end(&mut raw).await?;
        parse_response(&raw)
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"))?
}

/// GET `path`; the status code and body.
pub async fn get(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<Response> {
    request(addr, "GET", path, "", timeout).await
}

/// Splits a raw HTTP/1.x response into status and body (a chunked body is decoded).
pub fn parse_response(raw: &[u8]) -> std::io::Result<Response> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status code"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| bad("bad chunked body"))?
    } else {
        body.to_string()
    };
    Ok(Response { status, body })
}

fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse_with_and_without_chunks() {
        let plain =
            parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 17\r\n\r\n{\"health\":\"true\"}")
                .unwrap();
        assert_eq!(plain.status, 200);
        assert_eq!(plain.body, "{\"health\":\"true\"}");
        let chunked = parse_response(
            b"HTTP/1.1 409 Conflict\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            (chunked.status, chunked.body.as_str()),
            (409, "hello world")
        );
        assert!(parse_response(b"garbage").is_err());
    }

    #[tokio::test]
    async fn a_refused_port_is_an_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert!(get(port, "/", Duration::from_secs(1)).await.is_err());
    }
}

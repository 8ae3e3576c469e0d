//! Errors in the API layer: the model's [`Error`] (storage's errors convert into it), and the
//! one place where an error becomes a gRPC status with the code Bigtable uses.
//!
//! A refusal ("not owner", "moving": nothing was applied, the request may go to the owner)
//! travels between servers as a typed detail, never as text: its status carries the
//! `google.rpc.Status` of AIP-193 with one `google.rpc.ErrorInfo` of domain [`ERROR_DOMAIN`]
//! and reason `NOT_OWNER` or `MOVING` (metadata: the table, and the owner or tablet when
//! known), and [`refusal`] reads it back. The message stays as it was for clients and people.

use std::collections::HashMap;

use googleapis_tonic_google_rpc::google::rpc::{ErrorInfo, Status as RpcStatus};
use prost::Message;
use tonic::Status;

pub use basalt_model::{Code, Error, Result};

/// The gRPC code of a model code.
pub fn grpc_code(code: Code) -> tonic::Code {
    match code {
        Code::InvalidArgument => tonic::Code::InvalidArgument,
        Code::NotFound => tonic::Code::NotFound,
        Code::AlreadyExists => tonic::Code::AlreadyExists,
        Code::FailedPrecondition => tonic::Code::FailedPrecondition,
        Code::ResourceExhausted => tonic::Code::ResourceExhausted,
        Code::Unavailable => tonic::Code::Unavailable,
        Code::Unimplemented => tonic::Code::Unimplemented,
        Code::DataLoss => tonic::Code::DataLoss,
        Code::Internal => tonic::Code::Internal,
    }
}

/// The gRPC code a client sees for `e`.
pub fn code_of(e: &Error) -> tonic::Code {
    grpc_code(e.code())
}

/// `e` as the status a client receives (internal errors are logged: they are Basalt's bugs
/// or its disk's failures, never the client's). A refusal carries its `ErrorInfo`.
pub fn status(e: Error) -> Status {
    if let Error::Internal(msg) = &e {
        tracing::error!(error = %msg, "internal error returned to a client");
    }
    let rpc = rpc_status(&e);
    if rpc.details.is_empty() {
        Status::new(code_of(&e), rpc.message)
    } else {
        let details = rpc.encode_to_vec().into();
        Status::with_details(code_of(&e), rpc.message, details)
    }
}

/// As a `google.rpc.Status` (the per-entry statuses of MutateRows), with the same details as
/// [`status`].
pub fn rpc_status(e: &Error) -> RpcStatus {
    RpcStatus {
        code: code_of(e) as i32,
        message: e.to_string(),
        details: error_info(e)
            .map(|info| prost_types::Any {
                type_url: ERROR_INFO_TYPE.to_string(),
                value: info.encode_to_vec(),
            })
            .into_iter()
            .collect(),
    }
}

/// The domain of Basalt's `ErrorInfo` reasons.
pub const ERROR_DOMAIN: &str = "basalt.dev";
/// The type URL of a packed `google.rpc.ErrorInfo`.
const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// Why a server refused a request it could not serve: nothing was applied, and the same
/// request may be sent again once the tablet map names the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `Error::NotOwner`: the server does not own the row's tablet at the request's epoch.
    NotOwner,
    /// `Error::Moving`: the tablet is fenced for a move to another server.
    Moving,
}

impl Refusal {
    /// The `ErrorInfo` reason.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NotOwner => "NOT_OWNER",
            Refusal::Moving => "MOVING",
        }
    }

    fn of_reason(reason: &str) -> Option<Refusal> {
        [Refusal::NotOwner, Refusal::Moving]
            .into_iter()
            .find(|r| r.reason() == reason)
    }
}

/// The `ErrorInfo` of a refusal (None for any other error).
fn error_info(e: &Error) -> Option<ErrorInfo> {
    let (refusal, metadata): (Refusal, HashMap<String, String>) = match e {
        Error::NotOwner { table, owner, .. } => (
            Refusal::NotOwner,
            [("table", Some(table)), ("owner", owner.as_ref())]
                .into_iter()
                .filter_map(|(k, v)| Some((k.to_string(), v?.to_string())))
                .collect(),
        ),
        Error::Moving { tablet } => (
            Refusal::Moving,
            HashMap::from([("tablet".to_string(), tablet.clone())]),
        ),
        _ => return None,
    };
    Some(ErrorInfo {
        reason: refusal.reason().to_string(),
        domain: ERROR_DOMAIN.to_string(),
        metadata,
    })
}

/// The refusal `s` carries (an UNAVAILABLE with Basalt's `ErrorInfo`), if any. The message is
/// not read: an UNAVAILABLE that says the same words without the detail is no refusal.
pub fn refusal(s: &Status) -> Option<Refusal> {
    if s.code() != tonic::Code::Unavailable || s.details().is_empty() {
        return None;
    }
    RpcStatus::decode(s.details())
        .ok()
        .and_then(|rpc| rpc_refusal(&rpc))
}

/// The refusal a `google.rpc.Status` (a MutateRows entry's) carries, if any.
pub fn rpc_refusal(s: &RpcStatus) -> Option<Refusal> {
    if s.code != tonic::Code::Unavailable as i32 {
        return None;
    }
    s.details
        .iter()
        .filter(|any| any.type_url == ERROR_INFO_TYPE)
        .filter_map(|any| ErrorInfo::decode(any.value.as_slice()).ok())
        .filter(|info| info.domain == ERROR_DOMAIN)
        .find_map(|info| Refusal::of_reason(&info.reason))
}

impl From<crate::filter::FilterError> for Error {
    fn from(e: crate::filter::FilterError) -> Error {
        match e {
            crate::filter::FilterError::OutputTooLarge { .. } => {
                Error::ResourceExhausted(e.to_string())
            }
            e => Error::InvalidArgument(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_maps_to_bigtables_grpc_code() {
        let cases = [
            (
                Error::InvalidArgument("a".into()),
                tonic::Code::InvalidArgument,
            ),
            (Error::NotFound("a".into()), tonic::Code::NotFound),
            (Error::AlreadyExists("a".into()), tonic::Code::AlreadyExists),
            (
                Error::FailedPrecondition("a".into()),
                tonic::Code::FailedPrecondition,
            ),
            (
                Error::ResourceExhausted("a".into()),
                tonic::Code::ResourceExhausted,
            ),
            (Error::Unavailable("a".into()), tonic::Code::Unavailable),
            (Error::Unimplemented("a".into()), tonic::Code::Unimplemented),
            (Error::Internal("a".into()), tonic::Code::Internal),
            (
                Error::NotOwner {
                    table: "t".into(),
                    row: bytes::Bytes::from_static(b"r"),
                    owner: None,
                },
                tonic::Code::Unavailable,
            ),
        ];
        for (e, code) in cases {
            let s = status(e.clone());
            assert_eq!(s.code(), code, "{e:?}");
            assert_eq!(s.message(), e.to_string());
            assert_eq!(rpc_status(&e).code, code as i32);
        }
    }

    fn not_owner(owner: Option<&str>) -> Error {
        Error::NotOwner {
            table: "projects/p/instances/i/tables/t".into(),
            row: bytes::Bytes::from_static(b"r"),
            owner: owner.map(Into::into),
        }
    }

    #[test]
    fn a_refusal_travels_as_an_error_info_and_is_read_back() {
        let moving = Error::Moving {
            tablet: "t[a, b)".into(),
        };
        for (e, refused) in [
            (not_owner(Some("c1-2")), Refusal::NotOwner),
            (not_owner(None), Refusal::NotOwner),
            (moving, Refusal::Moving),
        ] {
            let s = status(e.clone());
            // The message is unchanged: clients and tests read it.
            assert_eq!(s.message(), e.to_string());
            assert_eq!(refusal(&s), Some(refused), "{e:?}");
            // The same through the wire's encoding of a status (as a peer's client sees it).
            let response = s.clone().into_http::<()>();
            let decoded = Status::from_header_map(response.headers()).unwrap();
            assert_eq!(refusal(&decoded), Some(refused), "{e:?}");
            // MutateRows' per-entry status carries the same detail.
            assert_eq!(rpc_refusal(&rpc_status(&e)), Some(refused), "{e:?}");
        }
        let rpc = RpcStatus::decode(status(not_owner(Some("c1-2"))).details()).unwrap();
        let info = ErrorInfo::decode(rpc.details[0].value.as_slice()).unwrap();
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("NOT_OWNER", "basalt.dev")
        );
        assert_eq!(info.metadata["table"], "projects/p/instances/i/tables/t");
        assert_eq!(info.metadata["owner"], "c1-2");
    }

    #[test]
    fn the_words_without_the_detail_are_no_refusal() {
        let e = not_owner(None);
        let words = Status::unavailable(e.to_string());
        assert_eq!(refusal(&words), None);
        let entry = RpcStatus {
            code: tonic::Code::Unavailable as i32,
            message: e.to_string(),
            details: vec![],
        };
        assert_eq!(rpc_refusal(&entry), None);
        // Nor is another error, or another code with the detail.
        assert_eq!(refusal(&status(Error::Unavailable("down".into()))), None);
        let mut other = rpc_status(&e);
        other.code = tonic::Code::Internal as i32;
        assert_eq!(rpc_refusal(&other), None);
    }
}

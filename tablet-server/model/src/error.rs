//! The error every layer speaks: a kind (with Bigtable's status code), a message, and whether a
//! client may retry it. Only the API layer turns it into a gRPC status; storage has an error of
//! its own that converts into this one.

use crate::tablet::ServerId;

/// The status code of an error, named as in `google.rpc.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    ResourceExhausted,
    Unavailable,
    Unimplemented,
    DataLoss,
    Internal,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request is malformed or breaks a documented limit.
    #[error("{0}")]
    InvalidArgument(String),
    /// A named table, family or other resource does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The resource to create exists already.
    #[error("{0}")]
    AlreadyExists(String),
    /// The request is valid but the resource's state forbids it (e.g. deletion protection).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The request would need more resources than the server grants one request.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The server is shutting down or otherwise not serving.
    #[error("{0}")]
    Unavailable(String),
    /// The RPC or option is not supported by Basalt (yet).
    #[error("{0}")]
    Unimplemented(String),
    /// This server does not own the tablet of `row` of `table` (at the epoch the request
    /// needs): nothing was applied, and the request may be sent again to the owner.
    #[error("this server does not serve row {row:?} of table {table}{}", .owner.as_ref().map(|o| format!(" (its owner is {o})")).unwrap_or_default())]
    NotOwner {
        table: String,
        row: bytes::Bytes,
        owner: Option<ServerId>,
    },
    /// The tablet of the request is fenced for a move to another server: nothing was applied,
    /// and the request may be sent again once the tablet map names its owner. (The message
    /// shares the "not owner" prefix: frontends treat both alike.)
    #[error(
        "this server does not serve tablet {tablet} while it moves to another server; nothing was applied"
    )]
    Moving { tablet: String },
    /// Stored data is damaged or missing (a backup's chunk whose checksum does not match).
    #[error("{0}")]
    DataLoss(String),
    /// A storage or internal failure.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The status code a client sees.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Unavailable(_) | Error::NotOwner { .. } | Error::Moving { .. } => {
                Code::Unavailable
            }
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::DataLoss(_) => Code::DataLoss,
            Error::Internal(_) => Code::Internal,
        }
    }

    /// May the same request succeed if sent again (here, or to the owner it names)? True only
    /// when the failure proves nothing was applied or applying twice is harmless to decide on
    /// by the caller: the server was not serving (UNAVAILABLE) or did not own the row.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable(_) | Error::NotOwner { .. } | Error::Moving { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_owner_is_a_retryable_unavailable_that_names_the_owner() {
        let e = Error::NotOwner {
            table: "projects/p/instances/i/tables/t".into(),
            row: bytes::Bytes::from_static(b"r1"),
            owner: Some(ServerId::from("c1-2")),
        };
        assert_eq!(e.code(), Code::Unavailable);
        assert!(e.retryable());
        let text = e.to_string();
        assert!(
            text.contains("tables/t") && text.contains("r1") && text.contains("c1-2"),
            "{text}"
        );
        assert!(!Error::InvalidArgument("x".into()).retryable());
        assert!(!Error::Internal("x".into()).retryable());
        assert!(Error::Unavailable("closing".into()).retryable());
    }
}

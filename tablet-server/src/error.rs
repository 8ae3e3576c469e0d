//! The tablet server's error type and its mapping to the gRPC status codes Bigtable uses.

use tonic::{Code, Status};

#[derive(Debug, Clone, thiserror::Error)]
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
    /// A storage or internal failure; the request may be retried.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::Internal(_) => Code::Internal,
        }
    }

    /// As a `google.rpc.Status` (used for the per-entry statuses of MutateRows).
    pub fn to_rpc_status(&self) -> googleapis_tonic_google_rpc::google::rpc::Status {
        googleapis_tonic_google_rpc::google::rpc::Status {
            code: self.code() as i32,
            message: self.to_string(),
            details: vec![],
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        if let Error::Internal(msg) = &e {
            tracing::error!(error = %msg, "internal error returned to a client");
        }
        Status::new(e.code(), e.to_string())
    }
}

impl From<rocksdb::Error> for Error {
    fn from(e: rocksdb::Error) -> Error {
        Error::Internal(format!("storage: {e}"))
    }
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

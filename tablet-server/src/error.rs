//! Errors in the API layer: the model's [`Error`] (storage's errors convert into it), and the
//! one place where an error becomes a gRPC status with the code Bigtable uses.

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
        Code::Internal => tonic::Code::Internal,
    }
}

/// The gRPC code a client sees for `e`.
pub fn code_of(e: &Error) -> tonic::Code {
    grpc_code(e.code())
}

/// `e` as the status a client receives (internal errors are logged: they are Basalt's bugs
/// or its disk's failures, never the client's).
pub fn status(e: Error) -> Status {
    if let Error::Internal(msg) = &e {
        tracing::error!(error = %msg, "internal error returned to a client");
    }
    Status::new(code_of(&e), e.to_string())
}

/// As a `google.rpc.Status` (the per-entry statuses of MutateRows).
pub fn rpc_status(e: &Error) -> googleapis_tonic_google_rpc::google::rpc::Status {
    googleapis_tonic_google_rpc::google::rpc::Status {
        code: code_of(e) as i32,
        message: e.to_string(),
        details: vec![],
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
}

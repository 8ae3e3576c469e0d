//! Storage's own error: a request storage refuses (in the model's words), or a failure of the
//! store itself. The API layer alone turns it into a gRPC status (through
//! [`basalt_model::Error`]).

/// Why a storage operation failed. Nothing was applied when it fails.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The operation cannot be applied as asked: a table or family that does not exist, a name
    /// that is taken, deletion protection, a filter that refused a row.
    #[error(transparent)]
    Request(#[from] basalt_model::Error),
    /// RocksDB failed (I/O, a full disk, a write stall that ended in an error).
    #[error("storage: {0}")]
    Io(String),
    /// The data directory holds something this server cannot read.
    #[error("corrupt data directory: {0}")]
    Corrupt(String),
    /// The store is closing: its commit thread is gone.
    #[error("the store is closing")]
    Closing,
    /// A bug or an impossible state.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn not_found(message: impl Into<String>) -> Error {
        Error::Request(basalt_model::Error::NotFound(message.into()))
    }

    pub(crate) fn already_exists(message: impl Into<String>) -> Error {
        Error::Request(basalt_model::Error::AlreadyExists(message.into()))
    }

    pub(crate) fn failed_precondition(message: impl Into<String>) -> Error {
        Error::Request(basalt_model::Error::FailedPrecondition(message.into()))
    }
}

impl From<rocksdb::Error> for Error {
    fn from(e: rocksdb::Error) -> Error {
        Error::Io(e.into_string())
    }
}

impl From<Error> for basalt_model::Error {
    fn from(e: Error) -> basalt_model::Error {
        match e {
            Error::Request(e) => e,
            Error::Closing => basalt_model::Error::Unavailable(e.to_string()),
            Error::Io(_) | Error::Corrupt(_) | Error::Internal(_) => {
                basalt_model::Error::Internal(e.to_string())
            }
        }
    }
}

impl Error {
    /// The status code of the error, as the model names it.
    pub fn code(&self) -> basalt_model::Code {
        basalt_model::Error::from(self.clone()).code()
    }
}

//! The one error type of configuration: every variant names where the problem is.
//!
//! Why a field path in every message: a fleet is started by an operator reading a log
//! line, and "config field `providers.bank.timeout`: …" is fixable without reading code.
//! A bad file is a startup error — never a panic at the first message.

/// A config error, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax or a field of the wrong shape.
    #[error("config {origin}: {message}")]
    Parse {
        /// The file (or "env").
        origin: String,
        /// The parser's message (it names the field and line).
        message: String,
    },
    /// A value that parses but makes no sense.
    #[error("config field `{field}`: {problem}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// A typed config that cannot be written as TOML (e.g. a duration finer than 1ms).
    #[error("cannot write config as TOML: {message}")]
    Write {
        /// The serializer's message (it names the value).
        message: String,
    },
}

/// A [`ConfigError::Invalid`] for `field`.
pub(crate) fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        problem: problem.into(),
    }
}

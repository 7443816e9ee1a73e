//! oncely-core.

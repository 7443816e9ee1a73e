//! oncely integration-test support: fresh databases, unique queue prefixes, spawned binaries.

//! oncely-worker: action workers, reconciler, providers, admin.

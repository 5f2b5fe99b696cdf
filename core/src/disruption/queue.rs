//! The disruption queue: executing commands safely (filled in with the orchestration).

//! Cluster snapshots read from YAML files.

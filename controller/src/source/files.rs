//! The manifest-directory source: reads, watches and reloads `--manifests DIR`.

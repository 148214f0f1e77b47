//! The command line the three service binaries share: the configuration file, the listen address
//! and `--insecure-open`, and what they do to a service's configuration. Each binary flattens
//! [`ServeArgs`] into its own `clap` parser beside its own flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The flags every service binary takes.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file (the service's page under docs/); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:8080.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Serve open routes on a non-loopback address anyway (the config's `insecure_open`); without
    /// it, a service whose routes are open (no service token; for the control service, no API
    /// keys) refuses to listen beyond loopback.
    #[arg(long)]
    pub insecure_open: bool,
}

impl ServeArgs {
    /// The configuration of `--config`, read by `load`, else the defaults.
    pub fn config_or_default<C: Default, E>(&self, load: impl FnOnce(&Path) -> Result<C, E>) -> Result<C, E> {
        match &self.config {
            Some(path) => load(path),
            None => Ok(C::default()),
        }
    }

    /// `--listen` and `--insecure-open` over the configuration's `listen` and `insecure_open`.
    pub fn apply(&self, listen: &mut SocketAddr, insecure_open: &mut bool) {
        if let Some(address) = self.listen {
            *listen = address;
        }
        *insecure_open |= self.insecure_open;
    }
}

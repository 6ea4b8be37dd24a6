//! The capability interfaces: grant checks, then the host call through [`HostOps`].
//!
//! Each call is checked in the same order: argument shape, grant (a miss is a `denied`
//! error naming the grant to add), stage (writes are refused in plans and checks, reboots
//! outside the interrupt stage), then the host operation runs on a blocking thread.
//!
//! [`checks`] holds what every call goes through; the interfaces' implementations are in
//! `basic` (types, log, node), `files`, `system` (kmod, services, sysctl) and `exec`
//! (exec, power).

mod basic;
mod checks;
mod exec;
mod files;
mod system;

use nodewright_api::grants::Capability;
use wasmtime::component::{HasSelf, Linker};

use crate::bindings::nodewright::plugin::{
    exec as exec_wit, files as files_wit, kmod, log, node, power, services, sysctl, types,
};
use crate::error::{Error, Result};
use crate::state::{CapState, HostState};

pub(crate) use checks::clip;

/// Builds a linker with WASI (nothing granted behind it), the always-linked interfaces and
/// exactly the capabilities in `caps`.
pub(crate) fn linker(engine: &wasmtime::Engine, caps: &[Capability]) -> Result<Linker<HostState>> {
    let mut linker = Linker::<HostState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(Error::link)?;
    fn get(s: &mut HostState) -> &mut CapState {
        &mut s.caps
    }
    types::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get).map_err(Error::link)?;
    log::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get).map_err(Error::link)?;
    node::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get).map_err(Error::link)?;
    for cap in caps {
        match cap {
            Capability::Files => files_wit::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
            Capability::Kmod => kmod::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
            Capability::Services => {
                services::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get)
            }
            Capability::Sysctl => sysctl::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
            Capability::Exec => exec_wit::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
            Capability::Power => power::add_to_linker::<_, HasSelf<CapState>>(&mut linker, get),
        }
        .map_err(Error::link)?;
    }
    Ok(linker)
}

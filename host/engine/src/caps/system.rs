//! `kmod`, `services` and `sysctl`: named host objects, each checked against the grammar
//! of its names and the grant.

use nodewright_api::grants::Capability;
use nodewright_api::hostargs;
use nodewright_hostops::ServiceVerb;

use crate::bindings::nodewright::plugin::{kmod, services, sysctl, types};
use crate::state::CapState;

use types::CapError;

impl kmod::Host for CapState {
    async fn load(&mut self, name: String, params: Vec<String>) -> Result<(), CapError> {
        let checked = self.grants.check_module(&name);
        self.check_name(Capability::Kmod, "load", &name, checked, true)?;
        if let Some(reason) = params.iter().find_map(|p| hostargs::module_param(p).err()) {
            return Err(self.deny_with(Capability::Kmod, "load", &name, reason));
        }
        let n = name.clone();
        self.host(Capability::Kmod, "load", &name, move |h| {
            h.kmod_load(&n, &params)
        })
        .await
    }

    async fn unload(&mut self, name: String) -> Result<(), CapError> {
        let checked = self.grants.check_module(&name);
        self.check_name(Capability::Kmod, "unload", &name, checked, true)?;
        let n = name.clone();
        self.host(Capability::Kmod, "unload", &name, move |h| {
            h.kmod_unload(&n)
        })
        .await
    }

    async fn depmod(&mut self, release: String) -> Result<(), CapError> {
        // Linked only when some module is granted, so the grant check is the link itself.
        if let Err(reason) = hostargs::kernel_release(&release) {
            return Err(self.deny_with(Capability::Kmod, "depmod", &release, reason));
        }
        if let Some(e) = self.refuse_write(Capability::Kmod, "depmod") {
            return Err(e);
        }
        let r = release.clone();
        self.host(Capability::Kmod, "depmod", &release, move |h| h.depmod(&r))
            .await
    }

    async fn is_loaded(&mut self, name: String) -> Result<bool, CapError> {
        let checked = self.grants.check_module(&name);
        self.check_name(Capability::Kmod, "is-loaded", &name, checked, false)?;
        self.host_in_place(Capability::Kmod, "is-loaded", &name, |h| {
            h.kmod_is_loaded(&name)
        })
    }
}

impl services::Host for CapState {
    async fn control(&mut self, verb: services::Verb, unit: String) -> Result<(), CapError> {
        let verb = match verb {
            services::Verb::Start => ServiceVerb::Start,
            services::Verb::Stop => ServiceVerb::Stop,
            services::Verb::Restart => ServiceVerb::Restart,
            services::Verb::Reload => ServiceVerb::Reload,
            services::Verb::Enable => ServiceVerb::Enable,
            services::Verb::Disable => ServiceVerb::Disable,
        };
        let checked = self.grants.check_service(&unit);
        self.check_name(Capability::Services, verb.as_str(), &unit, checked, true)?;
        // Whatever the grant's glob covers, systemd's power units are `power`'s alone.
        if hostargs::UnitName::parse(&unit).is_ok_and(|u| u.is_power_unit()) {
            let reason = format!(
                "{unit} halts, reboots or powers off the node: no services grant reaches it; a reboot is interrupt type reboot, with the power grant"
            );
            return Err(self.deny_with(Capability::Services, verb.as_str(), &unit, reason));
        }
        let u = unit.clone();
        self.host(Capability::Services, verb.as_str(), &unit, move |h| {
            h.service(verb, &u)
        })
        .await
    }

    async fn status(&mut self, unit: String) -> Result<services::UnitStatus, CapError> {
        let checked = self.grants.check_service(&unit);
        self.check_name(Capability::Services, "status", &unit, checked, false)?;
        let u = unit.clone();
        let s = self
            .host(Capability::Services, "status", &unit, move |h| {
                h.service_status(&u)
            })
            .await?;
        Ok(services::UnitStatus {
            active_state: s.active_state,
            enabled: s.enabled,
        })
    }

    async fn daemon_reload(&mut self) -> Result<(), CapError> {
        // Linked only when some unit is granted, so the grant check is the link itself.
        if let Some(e) = self.refuse_write(Capability::Services, "daemon-reload") {
            return Err(e);
        }
        self.host(Capability::Services, "daemon-reload", "", |h| {
            h.daemon_reload()
        })
        .await
    }
}

impl sysctl::Host for CapState {
    async fn get(&mut self, key: String) -> Result<String, CapError> {
        let checked = self.grants.check_sysctl(&key);
        self.check_name(Capability::Sysctl, "get", &key, checked, false)?;
        self.host_in_place(Capability::Sysctl, "get", &key, |h| h.sysctl_get(&key))
    }

    async fn set(&mut self, key: String, value: String) -> Result<(), CapError> {
        let checked = self.grants.check_sysctl(&key);
        self.check_name(Capability::Sysctl, "set", &key, checked, true)?;
        if let Err(reason) = hostargs::sysctl_value(&value) {
            return Err(self.deny_with(Capability::Sysctl, "set", &key, reason));
        }
        self.host_in_place(Capability::Sysctl, "set", &key, |h| {
            h.sysctl_set(&key, &value)
        })
    }
}

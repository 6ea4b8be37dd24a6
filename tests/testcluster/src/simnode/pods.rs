//! The pod side of the simulated kubelet: pods bound to its nodes run as local processes
//! (their commands, environment, mounts rewritten to the node's scratch root, real status
//! and exit codes, graceful deletion, restarts), and finish their deletion when stopped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::{Control, Inner, now};
use crate::proctree::{descendants, kill_group, kill_session};

pub(super) async fn watch_pods(inner: Arc<Inner>) {
    let api: Api<Pod> = Api::all(inner.client.clone());
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
            Ok(watcher::Event::Delete(p)) => {
                if let Some((_, tx)) = p
                    .metadata
                    .uid
                    .as_ref()
                    .and_then(|u| inner.pods.lock().expect("pods lock").remove(u))
                {
                    let _ = tx.send(Control::Delete(0));
                }
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "pod watch error (retrying)");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        if inner.node(&node).is_none() {
            continue;
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .unwrap_or(30)
            .max(0) as u64;
        let known = inner
            .pods
            .lock()
            .expect("pods lock")
            .get(&uid)
            .map(|(_, tx)| tx.clone());
        match known {
            Some(tx) if deleting => {
                let _ = tx.send(Control::Delete(grace));
            }
            Some(_) => {}
            None => {
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                if deleting || phase == "Succeeded" || phase == "Failed" {
                    if deleting {
                        finish_delete(&inner.client, &pod).await;
                    }
                    continue;
                }
                let (tx, rx) = watch::channel(Control::Run);
                inner
                    .pods
                    .lock()
                    .expect("pods lock")
                    .insert(uid, (node.clone(), tx));
                tokio::spawn(run_pod(inner.clone(), pod, node, rx));
            }
        }
    }
}

async fn finish_delete(client: &Client, pod: &Pod) {
    let api: Api<Pod> = Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    let _ = api
        .delete(pod.metadata.name.as_deref().unwrap_or_default(), &dp)
        .await;
}

/// One container's observed state.
#[derive(Clone, Debug, Default)]
struct ContainerRun {
    name: String,
    image: String,
    restarts: i32,
    state: Value,
    last_state: Value,
    running: bool,
    exit: Option<i32>,
}

fn pod_status(containers: &[ContainerRun], started: &str) -> Value {
    let all_done = containers.iter().all(|c| !c.running && c.exit.is_some());
    let phase = if !all_done {
        "Running"
    } else if containers.iter().all(|c| c.exit == Some(0)) {
        "Succeeded"
    } else {
        "Failed"
    };
    let ready = containers.iter().all(|c| c.running);
    let cond = |t: &str, ok: bool| json!({"type": t, "status": if ok { "True" } else { "False" }, "lastTransitionTime": now()});
    json!({"status": {
        "phase": phase,
        "startTime": started,
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "conditions": [cond("PodScheduled", true), cond("Initialized", true), cond("ContainersReady", ready), cond("Ready", ready)],
        "containerStatuses": containers.iter().map(|c| json!({
            "name": c.name, "image": c.image, "imageID": format!("sim://{}", c.image),
            "containerID": format!("sim://{}", c.name), "ready": c.running, "started": c.running,
            "restartCount": c.restarts, "state": c.state, "lastState": c.last_state,
        })).collect::<Vec<_>>(),
    }})
}

/// Rewrites `value` when it starts with one of the mount paths. The termination-message
/// path (always last in `mounts`, and distinctive) is also replaced inside strings, so
/// `sh -c '... > /dev/termination-log'` works.
fn rewrite(value: &str, mounts: &[(String, PathBuf)]) -> String {
    if let Some((term, file)) = mounts.last()
        && term.starts_with("/dev/")
        && value.contains(term.as_str())
        && value != term
    {
        return value.replace(term.as_str(), &file.display().to_string());
    }
    for (from, to) in mounts {
        if value == from {
            return to.display().to_string();
        }
        if let Some(rest) = value.strip_prefix(from.as_str())
            && rest.starts_with('/')
        {
            return format!("{}{rest}", to.display());
        }
        // `--flag=/mount/path` and `--flag=NAME=/mount/path` forms.
        if let Some((flag, v)) = value.split_once('=')
            && (v == from || v.starts_with(&format!("{from}/")) || v.contains('='))
        {
            let inner = rewrite(v, mounts);
            if inner != v {
                return format!("{flag}={inner}");
            }
        }
    }
    value.to_string()
}

async fn run_pod(inner: Arc<Inner>, pod: Pod, node: String, control: watch::Receiver<Control>) {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &ns);
    let started = now();
    let policy = spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    let pod_dir = inner.work.join(&uid);
    let _ = std::fs::create_dir_all(&pod_dir);
    inner
        .logs
        .lock()
        .expect("log dirs lock")
        .insert(format!("{ns}/{name}"), pod_dir.clone());
    let Some(sim) = inner.node(&node) else { return };
    let node_root = sim.spec.root.clone();
    let mut host_mounts: HashMap<String, PathBuf> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            v.host_path.as_ref().map(|h| {
                (
                    v.name.clone(),
                    node_root.join(h.path.trim_start_matches('/')),
                )
            })
        })
        .collect();
    // Secret and ConfigMap volumes: written into the pod's directory before any container
    // starts; while one cannot be read the pod waits, as a kubelet's mount does.
    for v in spec.volumes.iter().flatten() {
        if v.secret.is_none() && v.config_map.is_none() {
            continue;
        }
        let dir = pod_dir.join("volumes").join(&v.name);
        loop {
            match materialise(&inner.client, &ns, v, &dir).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::debug!(pod = %name, volume = %v.name, error = %e, "mount waits");
                    if !matches!(*control.borrow(), Control::Run) {
                        inner.pods.lock().expect("pods lock").remove(&uid);
                        finish_delete(&inner.client, &pod).await;
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        host_mounts.insert(v.name.clone(), dir);
    }

    let runs = Arc::new(Mutex::new(
        spec.containers
            .iter()
            .map(|c| ContainerRun {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                ..Default::default()
            })
            .collect::<Vec<_>>(),
    ));
    let (changed_tx, mut changed_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut handles = Vec::new();
    for (i, container) in spec.containers.iter().enumerate() {
        let mut mounts: Vec<(String, PathBuf)> = container
            .volume_mounts
            .iter()
            .flatten()
            .filter_map(|m| {
                host_mounts
                    .get(&m.name)
                    .map(|p| (m.mount_path.trim_end_matches('/').to_string(), p.clone()))
            })
            .collect();
        let term_path = container
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into());
        let term_file = pod_dir.join(format!("{}.termination-log", container.name));
        mounts.push((term_path, term_file.clone()));
        let ctx = ContainerCtx {
            container: container.clone(),
            index: i,
            policy: policy.clone(),
            mounts,
            term_file,
            log_file: pod_dir.join(format!("{}.log", container.name)),
            env: pod_env(&pod, &node, &node_root),
            cwd: pod_dir.clone(),
            fallback_to_logs: container.termination_message_policy.as_deref()
                == Some("FallbackToLogsOnError"),
        };
        handles.push(tokio::spawn(run_container(
            ctx,
            runs.clone(),
            changed_tx.clone(),
            control.clone(),
            sim.control.subscribe(),
            sim.live.clone(),
        )));
    }
    drop(changed_tx);
    // Write status whenever a container changes; stop when all container loops end.
    while changed_rx.recv().await.is_some() {
        let status = pod_status(&runs.lock().expect("runs lock"), &started);
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            tracing::debug!(pod = %name, error = %e, "status update failed");
        }
    }
    for h in handles {
        let _ = h.await;
    }
    inner.pods.lock().expect("pods lock").remove(&uid);
    let stopped = !matches!(*control.borrow(), Control::Run);
    if stopped {
        finish_delete(&inner.client, &pod).await;
    }
}

/// Writes a Secret or ConfigMap volume's files (all keys, or the `items` asked for) into
/// `dir`.
async fn materialise(
    client: &Client,
    ns: &str,
    volume: &k8s_openapi::api::core::v1::Volume,
    dir: &Path,
) -> Result<(), String> {
    use k8s_openapi::api::core::v1::{ConfigMap, KeyToPath, Secret};
    let (data, items): (
        std::collections::BTreeMap<String, Vec<u8>>,
        Option<Vec<KeyToPath>>,
    ) = if let Some(src) = &volume.secret {
        let name = src.secret_name.clone().unwrap_or_default();
        let secret = Api::<Secret>::namespaced(client.clone(), ns)
            .get(&name)
            .await
            .map_err(|e| format!("secret {name}: {e}"))?;
        let data = secret.data.unwrap_or_default();
        (
            data.into_iter().map(|(k, v)| (k, v.0)).collect(),
            src.items.clone(),
        )
    } else if let Some(src) = &volume.config_map {
        let name = src.name.clone();
        let map = Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get(&name)
            .await
            .map_err(|e| format!("configmap {name}: {e}"))?;
        let data = map.data.unwrap_or_default();
        (
            data.into_iter().map(|(k, v)| (k, v.into_bytes())).collect(),
            src.items.clone(),
        )
    } else {
        return Ok(());
    };
    let files: Vec<(String, String)> = match items {
        Some(items) => items.into_iter().map(|i| (i.key, i.path)).collect(),
        None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
    };
    for (key, path) in files {
        let bytes = data.get(&key).ok_or_else(|| format!("no key {key}"))?;
        let file = dir.join(&path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(&file, bytes).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn pod_env(pod: &Pod, node: &str, root: &Path) -> Vec<(String, String)> {
    vec![
        ("NODEWRIGHT_SIM_ROOT".into(), root.display().to_string()),
        ("NODEWRIGHT_SIM_NODE".into(), node.into()),
        (
            "POD_NAME".into(),
            pod.metadata.name.clone().unwrap_or_default(),
        ),
        (
            "POD_NAMESPACE".into(),
            pod.metadata.namespace.clone().unwrap_or_default(),
        ),
    ]
}

struct ContainerCtx {
    container: Container,
    index: usize,
    policy: String,
    mounts: Vec<(String, PathBuf)>,
    term_file: PathBuf,
    log_file: PathBuf,
    env: Vec<(String, String)>,
    cwd: PathBuf,
    fallback_to_logs: bool,
}

impl ContainerCtx {
    /// Present while the container is not running: the kubelet endpoint ends a follow on it.
    fn ended_file(&self) -> PathBuf {
        self.cwd.join(format!("{}.ended", self.container.name))
    }
}

impl ContainerCtx {
    fn field_ref(&self, path: &str) -> Option<String> {
        let find = |k: &str| {
            self.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        match path {
            "metadata.name" => find("POD_NAME"),
            "metadata.namespace" => find("POD_NAMESPACE"),
            "spec.nodeName" => find("NODEWRIGHT_SIM_NODE"),
            "status.hostIP" | "status.podIP" => Some("127.0.0.1".into()),
            _ => None,
        }
    }

    fn command(&self) -> Option<tokio::process::Command> {
        let mut argv: Vec<String> = self.container.command.clone().unwrap_or_default();
        argv.extend(self.container.args.clone().unwrap_or_default());
        let (program, args) = argv.split_first()?;
        // In a session of its own (`setsid` execs in place: the pid is the container's),
        // which is what the stop kills, as a runtime kills the container's cgroup.
        let mut cmd = tokio::process::Command::new("setsid");
        cmd.arg(rewrite(program, &self.mounts));
        cmd.args(args.iter().map(|a| rewrite(a, &self.mounts)));
        cmd.env_clear().env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for e in self.container.env.iter().flatten() {
            let value = match (&e.value, &e.value_from) {
                (Some(v), _) => Some(v.clone()),
                (None, Some(from)) => from
                    .field_ref
                    .as_ref()
                    .and_then(|f| self.field_ref(&f.field_path)),
                (None, None) => Some(String::new()),
            };
            if let Some(v) = value {
                cmd.env(&e.name, rewrite(&v, &self.mounts));
            }
        }
        cmd.current_dir(&self.cwd).stdin(Stdio::null());
        Some(cmd)
    }
}

/// A container's exit code as Kubernetes reports it: the code, or 128 + the signal.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

fn terminated(code: i32, message: String, started: &str) -> Value {
    json!({"terminated": {
        "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
        "message": message, "startedAt": started, "finishedAt": now(),
    }})
}

/// A container process counted among its node's live ones until dropped.
struct Live(Arc<AtomicUsize>);

impl Live {
    fn new(live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        Live(live.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn run_container(
    ctx: ContainerCtx,
    runs: Arc<Mutex<Vec<ContainerRun>>>,
    changed: tokio::sync::mpsc::UnboundedSender<()>,
    mut pod_control: watch::Receiver<Control>,
    mut node_control: watch::Receiver<Control>,
    live: Arc<AtomicUsize>,
) {
    let set = |f: &dyn Fn(&mut ContainerRun)| {
        f(&mut runs.lock().expect("runs lock")[ctx.index]);
        let _ = changed.send(());
    };
    loop {
        // Wait out a reboot in progress.
        loop {
            let rebooting = *node_control.borrow() == Control::Reboot;
            if !rebooting {
                break;
            }
            if node_control.changed().await.is_err() {
                return;
            }
        }
        let _ = std::fs::remove_file(&ctx.term_file);
        let _ = std::fs::remove_file(ctx.ended_file());
        let started = now();
        let child = match ctx.command() {
            None => None,
            Some(mut cmd) => {
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&ctx.log_file)
                    .ok();
                if let Some(log) = log {
                    cmd.stdout(log.try_clone().map(Stdio::from).unwrap_or(Stdio::null()))
                        .stderr(Stdio::from(log));
                }
                match cmd.spawn() {
                    Ok(c) => Some(c),
                    Err(e) => {
                        let msg = format!("cannot start: {e}");
                        set(&|c| {
                            c.running = false;
                            c.exit = Some(127);
                            c.state = terminated(127, msg.clone(), &started);
                        });
                        if ctx.policy == "Never" {
                            return;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        set(&|c| c.restarts += 1);
                        continue;
                    }
                }
            }
        };
        // Counted on the node from its start until it has been waited for.
        let counted = child.as_ref().map(|_| Live::new(&live));
        set(&|c| {
            c.running = true;
            c.exit = None;
            c.state = json!({"running": {"startedAt": started}});
        });
        let pid = child.as_ref().and_then(|c| c.id());
        // Wait for the process (or forever, for a sleeper) or a control change.
        let mut child = child;
        let outcome: (i32, Control) = loop {
            let wait = async {
                match child.as_mut() {
                    Some(c) => c.wait().await.ok().map(exit_code),
                    None => futures::future::pending().await,
                }
            };
            tokio::select! {
                code = wait => break (code.unwrap_or(137), Control::Run),
                _ = pod_control.changed() => {
                    let now_control = *pod_control.borrow();
                    if let Control::Delete(grace) = now_control {
                        let Some(pid) = pid else { break (0, Control::Delete(grace)) };
                        // Known before the main process goes (its orphans lose the link).
                        let tree = descendants(pid);
                        kill_group(pid, "-TERM");
                        let c = child.as_mut().expect("child with pid");
                        let code = match tokio::time::timeout(Duration::from_secs(grace), c.wait()).await {
                            Ok(Ok(s)) => exit_code(s),
                            _ => {
                                kill_group(pid, "-KILL");
                                let _ = c.wait().await;
                                137
                            }
                        };
                        // Whatever it started goes with the container, what it started
                        // during the grace period and what was orphaned too.
                        kill_session(pid, &tree);
                        break (code, Control::Delete(grace));
                    }
                }
                _ = node_control.changed() => {
                    let rebooting = *node_control.borrow() == Control::Reboot;
                    if rebooting {
                        if let Some(pid) = pid {
                            kill_session(pid, &descendants(pid));
                            let _ = child.as_mut().expect("child").wait().await;
                        }
                        break (137, Control::Reboot);
                    }
                }
            }
        };
        drop(counted);
        let (code, why) = outcome;
        let mut message = std::fs::read_to_string(&ctx.term_file).unwrap_or_default();
        if message.is_empty() && code != 0 && ctx.fallback_to_logs {
            let log = std::fs::read_to_string(&ctx.log_file).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            message = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
        }
        if why == Control::Reboot && message.is_empty() {
            message = "killed by a node reboot".into();
        }
        let state = terminated(code, message, &started);
        // Ends a `kubectl logs -f` of this run (the kubelet endpoint watches for it).
        let _ = std::fs::write(ctx.ended_file(), "");
        let restart = match why {
            Control::Delete(_) => false,
            Control::Run | Control::Reboot => {
                ctx.policy == "Always" || (ctx.policy == "OnFailure" && code != 0)
            }
        };
        set(&|c| {
            c.running = false;
            c.exit = Some(code);
            if restart {
                c.last_state = state.clone();
                c.state = json!({"waiting": {"reason": "CrashLoopBackOff"}});
            } else {
                c.state = state.clone();
            }
        });
        if !restart {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        set(&|c| c.restarts += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_rewritten_in_arguments() {
        let mounts = vec![
            ("/host".to_string(), PathBuf::from("/tmp/n1")),
            (
                "/dev/termination-log".to_string(),
                PathBuf::from("/tmp/p/t"),
            ),
        ];
        assert_eq!(rewrite("/host", &mounts), "/tmp/n1");
        assert_eq!(rewrite("/host/etc/x", &mounts), "/tmp/n1/etc/x");
        assert_eq!(rewrite("/hostile", &mounts), "/hostile");
        assert_eq!(rewrite("--root=/host/var", &mounts), "--root=/tmp/n1/var");
        assert_eq!(
            rewrite("--registry-ca=r.example:5000=/host/ca.pem", &mounts),
            "--registry-ca=r.example:5000=/tmp/n1/ca.pem"
        );
        assert_eq!(rewrite("--x=a=b", &mounts), "--x=a=b");
        assert_eq!(
            rewrite("--termination-log=/dev/termination-log", &mounts),
            "--termination-log=/tmp/p/t"
        );
        assert_eq!(
            rewrite("echo x > /dev/termination-log", &mounts),
            "echo x > /tmp/p/t"
        );
    }
}

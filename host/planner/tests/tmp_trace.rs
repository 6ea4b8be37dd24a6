mod world;
use nodewright_planner::Action;
use std::collections::BTreeMap;
use world::*;
#[test]
fn trace() {
    let mut w = World::new(20);
    w.add_cr("c", spec(serde_json::json!({"interruptionBudget": {"percent": 10}, "packages": {"tuning": plain_pkg()}})));
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..60 {
        let acts = w.step();
        for a in &acts {
            let k = match a {
                Action::PatchNode(p) => {
                    if p.node == "node-15" {
                        println!("{i} patch {:?}", p.annotations);
                    }
                    "patch"
                }
                Action::CreateJob(_) => "create",
                Action::DeleteJob { .. } => "delete",
                Action::SetStatus { .. } => "status",
                Action::Event(_) => "event",
                _ => "other",
            };
            *counts.entry(k.into()).or_default() += 1;
        }
        w.succeed_all(("none", 1));
    }
    println!("{counts:?}");
}

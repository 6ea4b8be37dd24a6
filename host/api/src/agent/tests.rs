use super::*;
use crate::node_state::Stage;

#[test]
fn run_stages_parse_what_they_print_and_map_to_node_stages() {
    for st in RunStage::ALL {
        assert_eq!(st.as_str().parse::<RunStage>(), Ok(st));
        assert_eq!(serde_json::to_value(st).unwrap(), st.as_str());
        if let Some(check) = st.check() {
            assert!(check.is_check() && check.read_only());
            assert_eq!(check.stage(), st.stage());
            assert_eq!(check.as_str(), format!("{st}-check"));
        }
    }
    for st in Stage::ALL {
        match RunStage::of(st) {
            Some(r) => assert_eq!((r.as_str(), r.is_check()), (st.as_str(), false)),
            None => assert_eq!(st, Stage::UninstallInterrupt),
        }
    }
    assert!(
        "apply-chek"
            .parse::<RunStage>()
            .unwrap_err()
            .contains("apply-check")
    );
}

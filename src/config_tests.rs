//! config.rs's tests: the run options, their checks and their errors.

use super::*;

fn items(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn presets_expand_to_registered_ids_without_duplicates() {
    let field = parse_methods(&items(&["field"])).unwrap();
    assert_eq!(field, attention::field_method_ids());
    for id in [
        "window",
        "topk",
        "bigbird",
        "reformer",
        "skeinformer",
        "vmean",
    ] {
        assert!(field.iter().any(|m| m == id), "{id}");
    }
    let mixed = parse_methods(&items(&["vmean", "figure", "vmean"])).unwrap();
    assert_eq!(mixed[0], "vmean");
    assert_eq!(mixed.len(), FIGURE_METHODS.len());
    assert!(parse_methods(&items(&["nope"])).is_err());
}

fn kernelized(methods: Option<&[&str]>) -> Result<RunConfig> {
    RunConfig::new(&RunOptions {
        target: Target::Kernelized,
        methods: methods.map(items),
        lengths: Some(items(&["512"])),
        ..RunOptions::default()
    })
}

#[test]
fn the_kernelized_target_takes_its_own_methods_and_refuses_the_others() {
    let cfg = kernelized(None).unwrap();
    assert_eq!(
        cfg.methods,
        attention::target_method_ids(Target::Kernelized)
    );
    assert_eq!(kernelized(Some(&["all"])).unwrap().methods, cfg.methods);
    assert_eq!(
        kernelized(Some(&["kernelized"])).unwrap().methods,
        cfg.methods
    );
    let err = format!("{:#}", kernelized(Some(&["zero", "vmean"])).unwrap_err());
    assert!(
        err.contains("vmean does not approximate the kernelized target")
            && err.contains("skyformer_gauss, skyformer_gauss_iter, performer_gauss"),
        "{err}"
    );
    for preset in ["field", "figure"] {
        let err = format!("{:#}", kernelized(Some(&[preset])).unwrap_err());
        assert!(err.contains("the run's target is kernelized"), "{err}");
    }
    // And the other way round: a kernelized method in a softmax run.
    let err = format!(
        "{:#}",
        parse_methods(&items(&["skyformer", "skyformer_gauss"])).unwrap_err()
    );
    assert!(err.contains("--target kernelized"), "{err}");
    assert!(parse_methods(&items(&["kernelized"])).is_err());
    // `all` is every softmax method with a d axis; the quantized family is `quant`.
    assert_eq!(
        parse_methods(&items(&["all"])).unwrap(),
        attention::field_method_ids()
    );
    assert_eq!(
        parse_methods(&items(&["quant"])).unwrap(),
        attention::family_method_ids(attention::Family::Quantized)
    );
    let err = RunConfig::new(&RunOptions {
        target: Target::Kernelized,
        figure: Some(FigurePreset::Skyformer),
        ..RunOptions::default()
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("drop --target kernelized"));
}

/// docs/reference.md §7.2–7.4: under the causal mask the causal methods are the default, a method
/// without a causal form is refused naming those that have one, the d grid and lengths are the
/// decoder ones, and a kernelized or figure run is refused.
#[test]
fn the_causal_mask_takes_the_causal_methods_and_refuses_the_others() {
    let causal = |methods: Option<&[&str]>| {
        RunConfig::new(&RunOptions {
            mask: Some(Mask::Causal),
            methods: methods.map(items),
            ..RunOptions::default()
        })
    };
    let cfg = causal(None).unwrap();
    assert_eq!(cfg.mask, Mask::Causal);
    // The §7.4 causal forms, then the prefill family (docs/reference.md §7.5), in registry order
    // (the quantized family, §8, has no d axis: `--methods quant` asks for it).
    let mut want = vec!["vmean", "performer_favor", "svd_optimal", "window", "topk"];
    want.extend(attention::family_method_ids(attention::Family::Prefill));
    assert_eq!(want.len(), 12);
    assert_eq!(cfg.methods, want);
    assert_eq!(cfg.lengths, [2048, 8192]);
    assert_eq!(cfg.features, [16, 32, 64, 128, 256, 512, 1024, 2048]);
    let err = format!(
        "{:#}",
        causal(Some(&["window", "nystromformer"])).unwrap_err()
    );
    assert!(
        err.contains("nystromformer has no causal form")
            && err.contains("vmean, performer_favor, svd_optimal, window, topk"),
        "{err}"
    );
    for refused in [
        "skyformer",
        "performer",
        "bigbird",
        "reformer",
        "informer",
        "linformer",
    ] {
        assert!(causal(Some(&[refused])).is_err(), "{refused}");
    }
    assert!(format!("{:#}", causal(Some(&["figure"])).unwrap_err()).contains("no causal form"));
    let err = RunConfig::new(&RunOptions {
        mask: Some(Mask::Causal),
        target: Target::Kernelized,
        ..RunOptions::default()
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("--mask none"), "{err:#}");
    // An unmasked run keeps its defaults and serializes without a mask.
    let plain = RunConfig::new(&RunOptions::default()).unwrap();
    assert_eq!(plain.mask, Mask::None);
    assert!(!serde_json::to_string(&plain).unwrap().contains("mask"));
    assert!(serde_json::to_string(&cfg)
        .unwrap()
        .contains("\"mask\":\"causal\""));
}

#[test]
fn softmax_configurations_serialize_as_before_targets_existed() {
    // A softmax run's manifest has no `target` (runs from before resume and compare), a
    // kernelized one names it, and both read back equal.
    let soft = RunConfig::new(&RunOptions {
        lengths: Some(items(&["512"])),
        ..RunOptions::default()
    })
    .unwrap();
    let json = serde_json::to_value(&soft).unwrap();
    assert!(json.get("target").is_none(), "{json}");
    assert_eq!(serde_json::from_value::<RunConfig>(json).unwrap(), soft);
    let kern = kernelized(None).unwrap();
    let json = serde_json::to_value(&kern).unwrap();
    assert_eq!(json["target"], "kernelized");
    assert_eq!(serde_json::from_value::<RunConfig>(json).unwrap(), kern);
}

#[test]
fn user_method_names_are_checked() {
    let user = |name: &str| {
        let mut o = RunOptions {
            methods: Some(items(&["vmean", name])),
            lengths: Some(items(&["16"])),
            features: Some(items(&["4"])),
            ..RunOptions::default()
        };
        o.user_methods.insert(
            name.to_string(),
            UserMethod {
                kind: "python function".into(),
                origin: "m.f".into(),
                sha256: "0".repeat(64),
            },
        );
        RunConfig::new(&o)
    };
    let cfg = user("my_window").unwrap();
    assert_eq!(cfg.methods, items(&["vmean", "my_window"]));
    assert!(user("skeinformer").is_err(), "a built-in id");
    assert!(user("field").is_err(), "a preset");
    assert!(user("has space").is_err());
    assert!(user("9lives").is_err());
}

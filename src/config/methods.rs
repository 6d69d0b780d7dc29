//! `--methods`: presets expanded and every id checked against the run's target and mask, with
//! the caller's own method names beside the built-in ones.

use std::collections::BTreeMap;

use anyhow::Result;

use super::{UserMethod, FIGURE_METHODS};
use crate::attention::{self, Mask, Target};
use crate::usage;

/// The method presets `--methods` expands, besides single ids.
pub const PRESETS: &[&str] = &["all", "field", "figure", "kernelized", "quant", "decode"];

/// Expands the presets and checks every id, for the softmax target.
pub fn parse_methods(values: &[String]) -> Result<Vec<String>> {
    parse_methods_with(values, &BTreeMap::new(), Target::Softmax)
}

/// A user method's name: CSV- and file-name-safe, and not a built-in id.
pub fn check_user_name(name: &str) -> Result<()> {
    let ok_chars = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        && name.as_bytes()[0].is_ascii_alphabetic();
    if !ok_chars {
        return Err(usage!(
            "method name '{name}': use 1–64 letters, digits, '_', '-' or '.', starting with a letter"
        ));
    }
    if attention::by_id(name).is_ok() || PRESETS.contains(&name) {
        return Err(usage!(
            "method name '{name}' is taken by a built-in method or preset; name yours differently"
        ));
    }
    Ok(())
}

/// Why `method` cannot be scored against `target`, naming the methods that can.
fn target_mismatch(id: &str, target: Target) -> anyhow::Error {
    let why = match target {
        Target::Kernelized => " (it estimates softmax attention: it row-normalises or is built from softmax blocks, docs/reference.md §6.4.1)",
        Target::Softmax => " (it estimates the Gaussian-kernel product C·V; run it with --target kernelized)",
    };
    usage!(
        "--methods: {id} does not approximate the {target} target{why}; methods for --target {target}: {}",
        attention::target_method_ids(target).join(", ")
    )
}

/// `parse_methods` for `target`, where the names in `user` stand for the caller's own methods.
/// Presets: `all` (every method of `target` with a budget d), `field` (every softmax method with a budget d),
/// `quant` (the quantized family, docs/reference.md §8), `figure` (the
/// papers' methods, softmax), `kernelized` (every kernelized-target method). A preset or id of
/// another target is refused with the methods that fit.
pub fn parse_methods_with(
    values: &[String],
    user: &BTreeMap<String, UserMethod>,
    target: Target,
) -> Result<Vec<String>> {
    parse_methods_masked(values, user, target, Mask::None)
}

/// [`parse_methods_masked`] for a run under the decode protocol (`decode` = Some(n_f), docs/reference.md
/// §9.1) or not: under it the methods are the §9 family and the §8 KV caches (`decode`: the §9
/// family; `quant`: the caches; `all`: both), anything else is refused naming them; without it a
/// §9 method or the `decode` preset is refused naming `--decode`. A user's method runs in
/// either (it is told the split).
pub fn parse_methods_decode(
    values: &[String],
    user: &BTreeMap<String, UserMethod>,
    target: Target,
    mask: Mask,
    decode: Option<usize>,
) -> Result<Vec<String>> {
    let decode_ids = attention::decode_method_ids();
    let family = attention::family_method_ids(attention::Family::Decode);
    let Some(n_f) = decode else {
        if let Some(v) = values
            .iter()
            .map(|s| s.trim())
            .find(|v| *v == "decode" || *v == "kvpress" || family.contains(v))
        {
            return Err(usage!(
                "--methods {v}: a decode-time method (docs/reference.md §9) runs only under the continuation protocol; add --decode N_F (e.g. --decode {})",
                attention::decode::RECOMMENDED_N_F
            ));
        }
        return parse_methods_masked(values, user, target, mask);
    };
    let mut out: Vec<String> = Vec::new();
    for v in values.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let ids: Vec<String> = match v {
            "decode" => attention::decode_preset_ids()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            "kvpress" => attention::press_method_ids()
                .iter()
                .map(|s| s.to_string())
                .collect(),
            "quant" => decode_ids
                .iter()
                .filter(|id| !family.contains(id))
                .map(|s| s.to_string())
                .collect(),
            "all" => decode_ids.iter().map(|s| s.to_string()).collect(),
            id if user.contains_key(id) => vec![id.to_string()],
            id if decode_ids.contains(&id) => vec![id.to_string()],
            id => {
                return Err(usage!(
                    "--methods {id}: not a method of the decode protocol (--decode {n_f}, docs/reference.md §9.1); it runs: {} (presets decode, kvpress, quant, all)",
                    decode_ids.join(", ")
                ))
            }
        };
        for id in ids {
            if !out.contains(&id) {
                out.push(id);
            }
        }
    }
    if out.is_empty() {
        return Err(usage!(
            "--methods is empty; under --decode: {}",
            decode_ids.join(", ")
        ));
    }
    Ok(out)
}

/// Why `id` has no form under `mask`, naming the methods that have one.
fn mask_mismatch(id: &str, mask: Mask) -> anyhow::Error {
    usage!(
        "--methods: {id} has no {mask} form (docs/reference.md §7.4: none exists or none is published for prefill); methods for --mask {mask}: {}",
        attention::mask_method_ids(Target::Softmax, mask).join(", ")
    )
}

/// [`parse_methods_with`] under `mask`: `all` and `field` keep the methods with a form for it,
/// `figure` is refused under the causal mask (the papers' methods have none), and a named
/// method without one is refused with the list that fits.
pub fn parse_methods_masked(
    values: &[String],
    user: &BTreeMap<String, UserMethod>,
    target: Target,
    mask: Mask,
) -> Result<Vec<String>> {
    if mask == Mask::Causal && target == Target::Kernelized {
        return Err(usage!(
            "--target kernelized with --mask causal: the kernelized target is defined without a mask (docs/reference.md §7.2); use --mask none, or --target softmax"
        ));
    }
    let mut out: Vec<String> = Vec::new();
    let strings = |v: Vec<&str>| v.into_iter().map(String::from).collect::<Vec<_>>();
    let preset_target = |name: &str, t: Target| -> Result<()> {
        if t == target {
            Ok(())
        } else {
            Err(usage!(
                "--methods {name}: a preset of {t} methods, but the run's target is {target}; use --methods all (every method for --target {target}) or name methods: {}",
                attention::target_method_ids(target).join(", ")
            ))
        }
    };
    for v in values.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let ids: Vec<String> = match v {
            // Every method with a d axis: the quantized family (no budget, and formats that refuse
            // some head dimensions, docs/reference.md §8.1) is asked for by name or with `quant`.
            "all" => strings(
                attention::mask_method_ids(target, mask)
                    .into_iter()
                    .filter(|id| attention::budgets(id, &[1]) != [0])
                    .filter(|id| {
                        attention::describe(id)
                            .is_none_or(|(f, _)| f != attention::Family::Decode)
                    })
                    .collect(),
            ),
            "field" => {
                preset_target(v, Target::Softmax)?;
                strings(attention::field_method_ids_masked(mask))
            }
            "quant" => {
                preset_target(v, Target::Softmax)?;
                strings(attention::family_method_ids(attention::Family::Quantized))
            }
            "figure" if mask == Mask::Causal => {
                return Err(usage!(
                    "--methods figure: the papers' methods have no causal form; under --mask causal use --methods all or name methods: {}",
                    attention::mask_method_ids(target, mask).join(", ")
                ))
            }
            "figure" => {
                preset_target(v, Target::Softmax)?;
                strings(FIGURE_METHODS.to_vec())
            }
            "kernelized" => {
                preset_target(v, Target::Kernelized)?;
                strings(attention::target_method_ids(Target::Kernelized))
            }
            id if user.contains_key(id) => vec![id.to_string()],
            id => {
                let m = attention::by_id(id).map_err(|e| usage!("--methods: {e}"))?;
                if !m.targets().contains(&target) {
                    return Err(target_mismatch(id, target));
                }
                if !m.masks().contains(&mask) {
                    return Err(mask_mismatch(id, mask));
                }
                vec![id.to_string()]
            }
        };
        for id in ids {
            if !out.contains(&id) {
                out.push(id);
            }
        }
    }
    if out.is_empty() {
        return Err(usage!(
            "--methods is empty; methods for --target {target}: {}, or one of the presets {}",
            attention::target_method_ids(target).join(", "),
            PRESETS.join(" / ")
        ));
    }
    Ok(out)
}

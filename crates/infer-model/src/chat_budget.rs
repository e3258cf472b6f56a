//! Size checks, made before they run, of the template methods and filters
//! whose result the render's budget ([`crate::chat::RENDER_MEMORY`]) would
//! otherwise see only once it exists: `minijinja-contrib`'s Python string
//! methods `join`, `format`, `split`, `rsplit` and `splitlines`, and
//! minijinja's `split`, `lines`, `escape` and `format` filters, build their
//! whole result first (and lists and maps written out, or through `string`
//! and `pprint`, were measured only as written),
//! so `''.join([s] * 100000)` or `'{:>99999999999}'.format(x)` asked for
//! gigabytes in one allocation and aborted the process. Each is charged an
//! upper bound of its result's size before it is called, which fails the
//! render with minijinja's out-of-fuel error once it passes the budget.

use minijinja::value::{Kwargs, Rest, Value, ValueKind, ValueOrKwargs};
use minijinja::{ErrorKind, State};

use crate::chat::{BYTES_PER_FUEL, RENDER_MEMORY};

/// Bytes a list slot costs (minijinja's `SLOT_COST`: a value and growth).
const SLOT_BYTES: u64 = 32;

/// The unknown-method callback of chat templates: Python's methods
/// (`minijinja_contrib::pycompat`), with the size of the result of those
/// named in the module documentation charged first.
pub(crate) fn unknown_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, minijinja::Error> {
    if let Some(s) = value.as_str() {
        let bound = match method {
            "join" => args.first().map_or(0, |items| join_bound(s, items)),
            "format" => format_bound(s, args),
            "split" | "rsplit" | "splitlines" => split_bound(s),
            _ => 0,
        };
        charge(state, bound)?;
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The `split` filter (minijinja's), charged first.
pub(crate) fn split_filter(
    state: &State,
    value: &Value,
    sep: Option<std::sync::Arc<str>>,
    maxsplits: Option<i64>,
) -> Result<Value, minijinja::Error> {
    charge(state, value.as_str().map_or(0, split_bound))?;
    minijinja::filters::split(value, sep, maxsplits)
}

/// The `lines` filter (minijinja's), charged first.
pub(crate) fn lines_filter(state: &State, value: &Value) -> Result<Value, minijinja::Error> {
    charge(state, value.as_str().map_or(0, split_bound))?;
    minijinja::filters::lines(value)
}

/// The `escape` (`e`) filter (minijinja's), charged first: an entity of 6
/// bytes per byte at most (`&quot;`).
pub(crate) fn escape_filter(state: &mut State, value: &Value) -> Result<Value, minijinja::Error> {
    charge(state, value.as_str().map_or(0, |s| (s.len() as u64).saturating_mul(6)))?;
    minijinja::filters::escape(state, value)
}

/// The printf-style `format` filter (minijinja's), charged first: the
/// format string, each `%` field as long as the longest argument's text,
/// and every number in the format string (widths, precisions) written out.
pub(crate) fn format_filter(
    state: &mut State,
    value: &Value,
    args: Rest<ValueOrKwargs>,
) -> Result<Value, minijinja::Error> {
    let fmt = value.as_str().unwrap_or_default();
    let values: Vec<Value> = args.iter().map(|a| a.clone().into_value()).collect();
    let longest = values.iter().map(text_bound).max().unwrap_or(0);
    let fields = fmt.matches('%').count() as u64;
    let numbers: u64 = fmt
        .split(|c: char| !c.is_ascii_digit())
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<u64>().unwrap_or(u64::MAX))
        .fold(0, u64::saturating_add);
    charge(state, (fmt.len() as u64).saturating_add(fields.saturating_mul(longest)).saturating_add(numbers))?;
    minijinja::filters::format(state, value, args)
}

/// The length of a value's text: a string's, the longest value of a map,
/// 32 for anything else.
fn text_bound(a: &Value) -> u64 {
    match a.kind() {
        ValueKind::String => a.as_str().map_or(0, str::len) as u64,
        ValueKind::Map => a.try_iter().map_or(0, |keys| {
            keys.filter_map(|k| a.get_item(&k).ok()).map(|v| v.as_str().map_or(32, str::len) as u64).max().unwrap_or(0)
        }),
        _ => 32,
    }
}

/// The `pprint` filter (minijinja's), after a bounded measure of a list or
/// map with its indentation (written out, each item of a value nested `d`
/// levels deep is indented by `4 d` bytes, which minijinja does not charge).
pub(crate) fn pprint_filter(value: &Value) -> Result<String, minijinja::Error> {
    if matches!(value.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::Iterable) {
        crate::chat::measure(value, &mut 0, 0, 4)?;
    }
    Ok(minijinja::filters::pprint(value))
}

/// How many times a filter may compare each item with another.
#[derive(Clone, Copy)]
enum Comparisons {
    /// Once or twice (`max`, `min`).
    Scan,
    /// About log2(n) times, and a few more (`sort`, `unique`, `dictsort`,
    /// `groupby`).
    Sort,
}

/// Charges an upper bound of the work of comparing the items of `value`
/// with each other: each item's size (its strings' bytes and 32 per item
/// inside it, a comparison's cost at most) times the comparisons it takes
/// part in. minijinja charges a sort by its number of comparisons, not by
/// what they compare: a loop sorting a thousand 1 MB strings took 0.12 s a
/// turn for a fraction of a percent of the budget. The
/// comparisons themselves charge what they visit as well, so twice the
/// bound must be left for them to finish.
fn charge_comparisons(state: &State, value: &Value, how: Comparisons) -> Result<(), minijinja::Error> {
    let remaining = state.fuel_levels().map_or(u64::MAX, |(_, left)| left).saturating_mul(BYTES_PER_FUEL);
    let Ok(items) = value.try_iter() else { return Ok(()) };
    let is_map = value.kind() == ValueKind::Map;
    let (mut total, mut n) = (0u64, 0u64);
    for item in items {
        n += 1;
        total = total.saturating_add(compared_size(&item, remaining, 0)?);
        if is_map {
            let v = value.get_item(&item).unwrap_or_default();
            total = total.saturating_add(compared_size(&v, remaining, 0)?);
        }
        if total > remaining {
            break;
        }
    }
    let times = match how {
        Comparisons::Scan => 2,
        Comparisons::Sort => u64::from(u64::BITS - n.leading_zeros()) + 2,
    };
    let bound = total.saturating_mul(times);
    if bound.saturating_mul(2) >= remaining {
        return Err(minijinja::Error::new(
            ErrorKind::OutOfFuel,
            "the comparisons would take more than the budget left",
        ));
    }
    state.consume_fuel(bound.div_ceil(BYTES_PER_FUEL))
}

/// What comparing `value` with another visits at most, in fuel units
/// (bytes): 32 for it and for each item inside it, and its strings' bytes;
/// counted until it passes `cap`; an error past minijinja's deepest walk
/// (where a comparison fails anyway).
fn compared_size(value: &Value, cap: u64, depth: usize) -> Result<u64, minijinja::Error> {
    let mut total = 32 + value.as_str().map_or(0, |s| s.len() as u64);
    if !matches!(value.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::Iterable) {
        return Ok(total);
    }
    if depth >= MAX_WALK_DEPTH {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("a value is nested more than {MAX_WALK_DEPTH} levels deep"),
        ));
    }
    let Ok(items) = value.try_iter() else { return Ok(total) };
    let is_map = value.kind() == ValueKind::Map;
    for item in items {
        total = total.saturating_add(compared_size(&item, cap, depth + 1)?);
        if is_map {
            let v = value.get_item(&item).unwrap_or_default();
            total = total.saturating_add(compared_size(&v, cap, depth + 1)?);
        }
        if total > cap {
            break;
        }
    }
    Ok(total)
}

/// The deepest minijinja walks into a value (its `bounds::MAX_DEPTH`,
/// vendor/minijinja/PATCHED.md).
const MAX_WALK_DEPTH: usize = 500;

/// The `sort` filter (minijinja's), its comparisons charged first.
pub(crate) fn sort_filter(state: &State, value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    charge_comparisons(state, &value, Comparisons::Sort)?;
    minijinja::filters::sort(state, value, kwargs)
}

/// The `unique` filter (minijinja's), its comparisons charged first.
pub(crate) fn unique_filter(state: &State, value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    charge_comparisons(state, &value, Comparisons::Sort)?;
    minijinja::filters::unique(state, value, kwargs)
}

/// The `dictsort` filter (minijinja's), its comparisons charged first.
pub(crate) fn dictsort_filter(state: &State, value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    charge_comparisons(state, value, Comparisons::Sort)?;
    minijinja::filters::dictsort(value, kwargs)
}

/// The `groupby` filter (minijinja's), its comparisons charged first.
pub(crate) fn groupby_filter(
    state: &State,
    value: Value,
    attribute: Option<&str>,
    kwargs: Kwargs,
) -> Result<Value, minijinja::Error> {
    charge_comparisons(state, &value, Comparisons::Sort)?;
    minijinja::filters::groupby(value, attribute, kwargs)
}

/// The `max` filter (minijinja's), its comparisons charged first.
pub(crate) fn max_filter(state: &State, value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    charge_comparisons(state, &value, Comparisons::Scan)?;
    minijinja::filters::max(state, value, kwargs)
}

/// The `min` filter (minijinja's), its comparisons charged first.
pub(crate) fn min_filter(state: &State, value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    charge_comparisons(state, &value, Comparisons::Scan)?;
    minijinja::filters::min(state, value, kwargs)
}

/// The bytes of the pieces of `s` split anywhere: a slot per byte at most,
/// and the bytes themselves.
fn split_bound(s: &str) -> u64 {
    (s.len() as u64 + 1).saturating_mul(SLOT_BYTES) + s.len() as u64
}

/// Charges `bytes` to the render's budget, failing (out of fuel) past it.
fn charge(state: &State, bytes: u64) -> Result<(), minijinja::Error> {
    if bytes > RENDER_MEMORY {
        return Err(minijinja::Error::new(
            ErrorKind::OutOfFuel,
            format!("the result would take more than the render's {} MiB", RENDER_MEMORY >> 20),
        ));
    }
    state.consume_fuel(bytes.div_ceil(BYTES_PER_FUEL))
}

/// The bytes of `sep.join(items)`: each item's text (a string's length, 32
/// for other values) and a separator between two, counted until the sum
/// passes the budget.
fn join_bound(sep: &str, items: &Value) -> u64 {
    let Ok(iter) = items.try_iter() else { return 0 };
    let mut total = 0u64;
    for item in iter {
        total += sep.len() as u64 + item.as_str().map_or(32, |s| s.len() as u64);
        if total > RENDER_MEMORY {
            break;
        }
    }
    total
}

/// The bytes of `fmt.format(args)` at most: the format string, each
/// replacement field as long as the longest argument's text, and every
/// width and precision in the fields written out in full.
fn format_bound(fmt: &str, args: &[Value]) -> u64 {
    let longest = args.iter().map(text_bound).max().unwrap_or(0);
    let mut total = fmt.len() as u64;
    let mut rest = fmt;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(escaped) = rest.strip_prefix('{') {
            rest = escaped;
            continue;
        }
        let field = &rest[..rest.find('}').unwrap_or(rest.len())];
        total = total.saturating_add(longest);
        if let Some((_, spec)) = field.split_once(':') {
            // Every run of digits of the spec (fill, width, precision).
            for digits in spec.split(|c: char| !c.is_ascii_digit()).filter(|d| !d.is_empty()) {
                total = total.saturating_add(digits.parse::<u64>().unwrap_or(u64::MAX));
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_bound_counts_fields_widths_and_precisions() {
        let x = [Value::from("abcd")];
        assert_eq!(format_bound("{}-{}", &x), 5 + 8);
        assert_eq!(format_bound("{{}}", &x), 4);
        assert_eq!(format_bound("{:>99999999999}", &x), 15 + 4 + 99_999_999_999);
        assert_eq!(format_bound("{:.999f}", &[Value::from(1.5)]), 8 + 32 + 999);
        assert_eq!(format_bound("{:999999999999999999999}", &x), u64::MAX);
    }

    #[test]
    fn join_bound_stops_past_the_budget() {
        let items = Value::from(vec![Value::from("x".repeat(1000)); 4]);
        assert_eq!(join_bound(", ", &items), 4 * 1002);
        let many = Value::from(vec![Value::from("x".repeat(1 << 20)); 1000]);
        assert!(join_bound("", &many) > RENDER_MEMORY && join_bound("", &many) < RENDER_MEMORY + (2 << 20));
    }
}

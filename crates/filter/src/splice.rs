//! Editing JSON text in place: replacing or removing elements of an array, or one value, while
//! every other byte is copied as received.
//!
//! The elements come from serde_json's borrowed [`RawValue`]s, which are sub-slices of the
//! text they were read from; their offsets locate them.

use serde_json::value::RawValue;

/// What becomes of one object (or array element).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rewrite {
    /// Keep it, byte for byte.
    Keep,
    /// Replace it with this JSON text.
    Replace(String),
    /// Remove it.
    Drop,
}

/// Where `part` (a sub-slice of `whole`, as borrowed `RawValue`s are) starts in `whole`.
pub(crate) fn offset_in(whole: &str, part: &str) -> usize {
    let offset = (part.as_ptr() as usize).wrapping_sub(whole.as_ptr() as usize);
    assert!(
        offset
            .checked_add(part.len())
            .is_some_and(|end| end <= whole.len()),
        "part is not a slice of whole"
    );
    offset
}

/// `whole` with the sub-slice `part` replaced by `new`.
pub(crate) fn splice(whole: &str, part: &str, new: &str) -> String {
    let start = offset_in(whole, part);
    let mut out = String::with_capacity(whole.len() - part.len() + new.len());
    out.push_str(&whole[..start]);
    out.push_str(new);
    out.push_str(&whole[start + part.len()..]);
    out
}

/// `list` with its items edited: `edits` (by index, ascending) replace or drop items, the rest
/// and all bytes before the first and after the last item are copied.
pub(crate) fn splice_items(
    list: &str,
    items: &[&RawValue],
    edits: Vec<(usize, Rewrite)>,
) -> String {
    let (Some(first), Some(last)) = (items.first(), items.last()) else {
        return list.to_owned();
    };
    let start = offset_in(list, first.get());
    let end = offset_in(list, last.get()) + last.get().len();
    let mut out = String::with_capacity(list.len());
    out.push_str(&list[..start]);
    let mut edits = edits.into_iter().peekable();
    let mut separator = "";
    for (i, item) in items.iter().enumerate() {
        let edit = edits.next_if(|(at, _)| *at == i).map(|(_, edit)| edit);
        let piece = match &edit {
            None | Some(Rewrite::Keep) => item.get(),
            Some(Rewrite::Replace(new)) => new.as_str(),
            Some(Rewrite::Drop) => continue,
        };
        out.push_str(separator);
        out.push_str(piece);
        separator = ",";
    }
    out.push_str(&list[end..]);
    out
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Deserialize)]
    struct Shape<'a> {
        #[serde(borrow)]
        items: Vec<&'a RawValue>,
        #[serde(borrow)]
        object: Option<&'a RawValue>,
    }

    #[test]
    fn splice_replaces_a_sub_slice() {
        let whole = r#"{"items":[],"object":{"a":1}}"#;
        let shape: Shape<'_> = serde_json::from_str(whole).unwrap();
        assert_eq!(
            splice(whole, shape.object.unwrap().get(), r#"{"b":2}"#),
            r#"{"items":[],"object":{"b":2}}"#
        );
    }

    #[test]
    #[should_panic(expected = "not a slice")]
    fn offsets_outside_the_text_are_refused() {
        offset_in("abc", "abc".to_owned().as_str());
    }

    #[test]
    fn splice_items_edits_first_middle_and_last() {
        let list = r#"{"kind":"L","items":[ {"i":0} , {"i":1},{"i":2},{"i":3} ],"metadata":{}}"#;
        let all = serde_json::from_str::<Shape<'_>>(list).unwrap().items;
        let edits = vec![
            (0, Rewrite::Drop),
            (2, Rewrite::Replace(r#"{"i":"two"}"#.into())),
            (3, Rewrite::Drop),
        ];
        assert_eq!(
            splice_items(list, &all, edits),
            r#"{"kind":"L","items":[ {"i":1},{"i":"two"} ],"metadata":{}}"#
        );
        let edits = vec![(1, Rewrite::Keep), (3, Rewrite::Replace("{}".into()))];
        assert_eq!(
            splice_items(list, &all, edits),
            r#"{"kind":"L","items":[ {"i":0},{"i":1},{"i":2},{} ],"metadata":{}}"#
        );
        let everything = (0..4).map(|i| (i, Rewrite::Drop)).collect();
        assert_eq!(
            splice_items(list, &all, everything),
            r#"{"kind":"L","items":[  ],"metadata":{}}"#
        );
    }
}

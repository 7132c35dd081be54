//! The [`Filter`] trait every response filter implements, and what a filter answers.
//!
//! A filter is a stateless rule: which requests it applies to ([`Rule`]s and default
//! components), a cheap [`Filter::peek`] at an object's [`Head`] and, only when the peek asks for
//! it, [`Filter::filter`] on the decoded object. Everything a rule depends on besides the object
//! comes in the [`FilterContext`], so one static instance serves every request.

use outpost_core::Verb;
use serde_json::Value;

use crate::head::Head;
use crate::{FilterContext, Rewrite};

/// A kind of request a filter applies to: one resource in one API group, some versions and verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The API group (`""` for the core group).
    pub group: &'static str,
    pub versions: &'static [&'static str],
    pub resource: &'static str,
    /// The kind of the objects (`Service`); a body of another kind (`Status`, `Table`,
    /// `PartialObjectMetadata`…) passes unfiltered.
    pub kind: &'static str,
    pub verbs: &'static [Verb],
}

impl Rule {
    pub fn matches(&self, group: &str, version: &str, resource: &str, verb: Verb) -> bool {
        self.resource == resource
            && self.group == group
            && self.versions.contains(&version)
            && self.verbs.contains(&verb)
    }
}

/// The outcome of a [`Filter::peek`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peek {
    /// The filter leaves this object alone.
    Pass,
    /// The filter removes this object; no need to decode it.
    Drop,
    /// The filter needs the decoded object: call [`Filter::filter`].
    Inspect,
}

/// The outcome of a [`Filter::filter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not modified.
    Keep,
    /// Modified in place.
    Changed,
    /// Removed from the response (a watch event becomes `DELETED`).
    Drop,
}

impl Verdict {
    /// `Changed` when the filter modified the object, else `Keep`.
    pub fn changed_if(changed: bool) -> Verdict {
        if changed {
            Verdict::Changed
        } else {
            Verdict::Keep
        }
    }
}

/// One response filter. Implementations are unit structs; see [`crate::filters`].
pub trait Filter: Send + Sync + 'static {
    /// The name used by `--disabled-resource-filters` and the `yurt-hub-cfg` keys.
    fn name(&self) -> &'static str;

    /// The components (User-Agent up to the first `/`) the filter applies to by default.
    fn default_components(&self) -> &'static [&'static str];

    /// The requests the filter applies to.
    fn rules(&self) -> &'static [Rule];

    /// yurthub turns some filters off in cloud mode (the hub is not in front of a real edge
    /// node's pods there).
    fn off_in_cloud_mode(&self) -> bool {
        false
    }

    /// Whether the filter needs the hub's Service watch, and its NodePool watch.
    fn needs(&self) -> Needs {
        Needs::default()
    }

    /// The rule that `group/version/resource` + `verb` falls under, if any.
    fn applies_to(
        &self,
        group: &str,
        version: &str,
        resource: &str,
        verb: Verb,
    ) -> Option<&'static Rule> {
        self.rules()
            .iter()
            .find(|r| r.matches(group, version, resource, verb))
    }

    /// The one object (namespace, name) the filter can change, for a filter that only ever
    /// touches one; `None`: any object. A request that names another object or namespace gets
    /// nothing from the filter, so its response need not wait for it ([`crate::Chain`]).
    fn only_object(&self) -> Option<(&'static str, &'static str)> {
        None
    }

    /// Whether [`Filter::peek`] reads [`Head::spec_type`]. Heads are otherwise read only up to
    /// `metadata`, which spares scanning the (large) spec of Pods.
    fn peeks_at_spec_type(&self) -> bool {
        false
    }

    /// Bytes that every object this filter could change contains within its own JSON text, or
    /// `None` (the default) when there are none to name. A list in which no filter's marker
    /// occurs goes out without being read, and a LIST can then stream through: only the items
    /// around a marker have to wait to be read (`outpost_proxy`'s streamed lists).
    fn marker(&self) -> Option<&'static [u8]> {
        None
    }

    /// Decides from the object's head alone. `head.kind` is the rule's kind (other kinds never
    /// reach a filter). Must be cheap: it runs on every object of every filtered response.
    fn peek(&self, head: &Head<'_>, ctx: &FilterContext) -> Peek;

    /// Rewrites or drops the decoded object. Called only after [`Filter::peek`] said
    /// [`Peek::Inspect`]; `head` is the object as received (before earlier filters' changes).
    /// Return [`Verdict::Changed`] only if `obj` really changed: an unchanged response keeps its
    /// original bytes.
    fn filter(&self, obj: &mut Value, head: &Head<'_>, ctx: &FilterContext) -> Verdict;

    /// Optional fast path: the same rule applied to the object's JSON text (`head.raw` may be a
    /// whole event line; `raw` is the object), for rules that only cut elements out of an
    /// array. The chain tries it instead of [`Filter::filter`] when this filter is the only one
    /// inspecting the object; `None` means "decode it after all".
    fn filter_text(&self, _raw: &str, _head: &Head<'_>, _ctx: &FilterContext) -> Option<Rewrite> {
        None
    }
}

/// Side data a set of filters depends on; the proxy keeps those watches (and gates readiness on
/// them) only when needed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// All Services (for their annotations).
    pub services: bool,
    /// NodePool membership.
    pub node_pools: bool,
    /// The pool name (`--nodepool-name`, or this Node's label).
    pub pool_name: bool,
}

impl Needs {
    pub fn union(self, other: Needs) -> Needs {
        Needs {
            services: self.services || other.services,
            node_pools: self.node_pools || other.node_pools,
            pool_name: self.pool_name || other.pool_name,
        }
    }
}

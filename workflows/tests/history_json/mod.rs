//! Decodes a workflow history in the protobuf JSON form that `temporal workflow show --output
//! json` (and the Web UI's download) writes into the SDK's `History` proto.
//!
//! `temporalio_client::WorkflowHistory::from_json` only reads the SDK's own serde form (snake_case
//! keys, every field present, enums as numbers, the event attributes wrapped in an `attributes`
//! enum), not this one. The messages of the `common`, `enums` and `failure` packages carry
//! protobuf-JSON (pbjson) deserializers, so only the serde-derived messages around them need
//! adapting. This module is a serde `Deserializer` over a `serde_json::Value` that adapts while
//! the generated types drive it:
//! - JSON `lowerCamelCase` keys map to the Rust `snake_case` field names,
//! - fields protobuf JSON leaves out (default values) are filled with their defaults,
//! - 64-bit integers written as strings and enum values written as names become numbers,
//! - `HistoryEvent`'s `...EventAttributes` key becomes its `attributes` oneof.
//!
//! Keys that match no field are errors rather than silently dropped: a replay on a history that
//! lost part of its content would prove nothing.

use std::fmt;

use serde::Deserialize;
use serde::de::{
    self, DeserializeSeed, EnumAccess, IntoDeserializer, MapAccess, SeqAccess, VariantAccess,
    Visitor,
};
use serde_json::Value;
use temporalio_common::protos::temporal::api::enums::v1 as enums;
use temporalio_common::protos::temporal::api::history::v1::History;

/// Oneofs of serde-derived messages: (message, oneof field, suffix of the JSON keys of its
/// members). Members are written as sibling keys of the other fields in protobuf JSON.
const ONEOFS: &[(&str, &str, &str)] = &[
    ("HistoryEvent", "attributes", "Attributes"),
    // An update's outcome: `success` or `failure` (its only fields).
    ("Outcome", "value", ""),
];

/// Why a history could not be decoded.
#[derive(Debug)]
pub struct DecodeError(String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

impl de::Error for DecodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

type Result<T> = std::result::Result<T, DecodeError>;

/// Decodes `{"events": [...]}` as written by `temporal workflow show --output json`.
pub fn decode_history(json: &[u8]) -> Result<History> {
    let value: Value =
        serde_json::from_slice(json).map_err(|e| DecodeError(format!("not JSON: {e}")))?;
    History::deserialize(Node::new(&value, String::new()))
}

/// Any JSON value, read as the type that asks for it.
struct Node<'a> {
    value: &'a Value,
    path: String,
}

impl<'a> Node<'a> {
    fn new(value: &'a Value, path: String) -> Self {
        Self { value, path }
    }

    fn error(&self, what: impl fmt::Display) -> DecodeError {
        let path = if self.path.is_empty() {
            "<root>"
        } else {
            &self.path
        };
        DecodeError(format!("{path}: {what}"))
    }

    fn integer(&self) -> Result<i64> {
        match self.value {
            Value::Number(n) => n
                .as_i64()
                .ok_or_else(|| self.error(format!("{n} is not a signed 64-bit integer"))),
            Value::String(s) => s
                .parse()
                .ok()
                .or_else(|| enum_number(s).map(i64::from))
                .ok_or_else(|| {
                    self.error(format!(
                        "{s:?} is neither an integer nor a known enum value"
                    ))
                }),
            other => Err(self.error(format!("expected an integer, found {other}"))),
        }
    }

    fn unsigned(&self) -> Result<u64> {
        match self.value {
            Value::Number(n) => n
                .as_u64()
                .ok_or_else(|| self.error(format!("{n} is not an unsigned 64-bit integer"))),
            Value::String(s) => s
                .parse()
                .map_err(|_| self.error(format!("{s:?} is not an unsigned integer"))),
            other => Err(self.error(format!("expected an integer, found {other}"))),
        }
    }

    fn float(&self) -> Result<f64> {
        match self.value {
            Value::Number(n) => n
                .as_f64()
                .ok_or_else(|| self.error(format!("{n} is not a number"))),
            Value::String(s) => match s.as_str() {
                "NaN" => Ok(f64::NAN),
                "Infinity" => Ok(f64::INFINITY),
                "-Infinity" => Ok(f64::NEG_INFINITY),
                _ => s
                    .parse()
                    .map_err(|_| self.error(format!("{s:?} is not a number"))),
            },
            other => Err(self.error(format!("expected a number, found {other}"))),
        }
    }

    fn object(&self) -> Result<&'a serde_json::Map<String, Value>> {
        self.value
            .as_object()
            .ok_or_else(|| self.error(format!("expected an object, found {}", self.value)))
    }
}

macro_rules! signed {
    ($($method:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
            visitor.visit_i64(self.integer()?)
        }
    )*};
}

macro_rules! unsigned {
    ($($method:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
            visitor.visit_u64(self.unsigned()?)
        }
    )*};
}

impl<'de, 'a> de::Deserializer<'de> for Node<'a> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => visitor.visit_u64(u),
                (None, Some(i), _) => visitor.visit_i64(i),
                (None, None, Some(f)) => visitor.visit_f64(f),
                (None, None, None) => Err(self.error(format!("unreadable number {n}"))),
            },
            Value::String(s) => visitor.visit_str(s),
            Value::Array(items) => visitor.visit_seq(Items::new(items, &self.path)),
            Value::Object(map) => visitor.visit_map(Entries::raw(map, &self.path)),
        }
    }

    signed!(
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64
    );
    unsigned!(
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64
    );

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_f64(self.float()?)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_f64(self.float()?)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.value {
            Value::Bool(b) => visitor.visit_bool(*b),
            other => Err(self.error(format!("expected a boolean, found {other}"))),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.value {
            Value::String(s) => visitor.visit_str(s),
            other => Err(self.error(format!("expected a string, found {other}"))),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.value {
            Value::Array(items) => visitor.visit_seq(Items::new(items, &self.path)),
            other => Err(self.error(format!("expected a list, found {other}"))),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let map = self.object()?;
        visitor.visit_map(Entries::raw(map, &self.path))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        let map = self.object()?;
        if name.contains('.') {
            // pbjson messages are named by their full protobuf name and read protobuf JSON
            // themselves (camelCase keys, defaults left out, enum names, int64 strings).
            visitor.visit_map(Entries::raw(map, &self.path))
        } else {
            visitor.visit_map(Entries::message(map, &self.path, name, fields)?)
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        match self.value {
            Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()),
            Value::Object(map) if map.len() == 1 => match map.iter().next() {
                Some((variant, value)) => visitor.visit_enum(Oneof {
                    variant: variant.clone(),
                    node: Node::new(value, format!("{}.{variant}", self.path)),
                }),
                None => Err(self.error("empty enum object")),
            },
            other => Err(self.error(format!("expected an enum, found {other}"))),
        }
    }

    serde::forward_to_deserialize_any! {
        bytes byte_buf unit unit_struct tuple tuple_struct ignored_any
    }
}

/// A list.
struct Items<'a> {
    items: std::slice::Iter<'a, Value>,
    path: &'a str,
    index: usize,
}

impl<'a> Items<'a> {
    fn new(items: &'a [Value], path: &'a str) -> Self {
        Self {
            items: items.iter(),
            path,
            index: 0,
        }
    }
}

impl<'de> SeqAccess<'de> for Items<'_> {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        let Some(item) = self.items.next() else {
            return Ok(None);
        };
        let path = format!("{}[{}]", self.path, self.index);
        self.index += 1;
        seed.deserialize(Node::new(item, path)).map(Some)
    }
}

/// One entry of an object handed to a visitor.
enum Entry<'a> {
    /// Present in the JSON.
    Present(&'a Value),
    /// Left out of the JSON: the field's default.
    Missing,
    /// A member of a oneof, written as its own key.
    Oneof { variant: String, value: &'a Value },
}

/// The entries of an object: as written (maps, pbjson messages) or mapped onto the fields of
/// a serde-derived message.
struct Entries<'a> {
    entries: std::vec::IntoIter<(String, Entry<'a>)>,
    pending: Option<(String, Entry<'a>)>,
    path: &'a str,
}

impl<'a> Entries<'a> {
    fn raw(map: &'a serde_json::Map<String, Value>, path: &'a str) -> Self {
        let entries: Vec<_> = map
            .iter()
            .map(|(k, v)| (k.clone(), Entry::Present(v)))
            .collect();
        Self {
            entries: entries.into_iter(),
            pending: None,
            path,
        }
    }

    fn message(
        map: &'a serde_json::Map<String, Value>,
        path: &'a str,
        name: &str,
        fields: &'static [&'static str],
    ) -> Result<Self> {
        let mut entries = Vec::with_capacity(fields.len());
        let mut seen = Vec::with_capacity(fields.len());
        for (key, value) in map {
            let snake = snake_case(key);
            if let Some(field) = fields
                .iter()
                .find(|f| **f == key.as_str() || **f == snake.as_str())
            {
                seen.push(*field);
                entries.push(((*field).to_owned(), Entry::Present(value)));
                continue;
            }
            let oneof = ONEOFS
                .iter()
                .find(|(message, _, suffix)| *message == name && key.ends_with(suffix));
            match oneof {
                Some((_, field, _)) if !seen.contains(field) => {
                    seen.push(*field);
                    entries.push((
                        (*field).to_owned(),
                        Entry::Oneof {
                            variant: pascal_case(key),
                            value,
                        },
                    ));
                }
                Some((_, field, _)) => {
                    return Err(DecodeError(format!(
                        "{path}: two members of oneof {name}.{field}"
                    )));
                }
                None => {
                    return Err(DecodeError(format!(
                        "{path}: unknown field {key:?} of {name} (newer server than the SDK's \
                         protos? extend tests/history_json)"
                    )));
                }
            }
        }
        for field in fields {
            if !seen.contains(field) {
                entries.push(((*field).to_owned(), Entry::Missing));
            }
        }
        Ok(Self {
            entries: entries.into_iter(),
            pending: None,
            path,
        })
    }
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        let Some((key, entry)) = self.entries.next() else {
            return Ok(None);
        };
        let out = seed.deserialize(key.as_str().into_deserializer()).map(Some);
        self.pending = Some((key, entry));
        out
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        let (key, entry) = self
            .pending
            .take()
            .ok_or_else(|| DecodeError(format!("{}: value before key", self.path)))?;
        let path = if self.path.is_empty() {
            key
        } else {
            format!("{}.{key}", self.path)
        };
        match entry {
            Entry::Present(value) => seed.deserialize(Node::new(value, path)),
            Entry::Missing => seed.deserialize(Absent { path }),
            Entry::Oneof { variant, value } => seed.deserialize(Oneof {
                node: Node::new(value, format!("{path}.{variant}")),
                variant,
            }),
        }
    }
}

/// A oneof member: `Some(Variant(value))`.
struct Oneof<'a> {
    variant: String,
    node: Node<'a>,
}

impl<'de, 'a> de::Deserializer<'de> for Oneof<'a> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(self.node.error(format!(
            "oneof member {} read as something else than an enum",
            self.variant
        )))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_some(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

impl<'de, 'a> EnumAccess<'de> for Oneof<'a> {
    type Error = DecodeError;
    type Variant = Node<'a>;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Node<'a>)> {
        let variant = seed.deserialize(self.variant.as_str().into_deserializer())?;
        Ok((variant, self.node))
    }
}

impl<'de> VariantAccess<'de> for Node<'_> {
    type Error = DecodeError;

    fn unit_variant(self) -> Result<()> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value> {
        de::Deserializer::deserialize_seq(self, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        de::Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

/// A field protobuf JSON left out: its default value.
struct Absent {
    path: String,
}

impl<'de> de::Deserializer<'de> for Absent {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(DecodeError(format!(
            "{}: missing, and its type has no protobuf default",
            self.path
        )))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_none()
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_bool(false)
    }

    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_i32(0)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_i64(0)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_u32(0)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_u64(0)
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_f32(0.0)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_f64(0.0)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_str("")
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_str("")
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_bytes(&[])
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_bytes(&[])
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_seq(Items::new(&[], &self.path))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_map(Entries {
            entries: Vec::new().into_iter(),
            pending: None,
            path: &self.path,
        })
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i128 u8 u16 u128 char unit unit_struct newtype_struct tuple tuple_struct struct
        enum identifier ignored_any
    }
}

/// `workflowTaskStartedEventId` -> `workflow_task_started_event_id`.
fn snake_case(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 8);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `workflowTaskStartedEventAttributes` -> `WorkflowTaskStartedEventAttributes`.
fn pascal_case(key: &str) -> String {
    let mut chars = key.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// The number of an enum value written by name (`EVENT_TYPE_TIMER_FIRED`). Protobuf enum value
/// names carry their enum's name as a prefix, so one lookup over the enums that serde-derived
/// history messages use is unambiguous.
fn enum_number(name: &str) -> Option<i32> {
    macro_rules! lookup {
        ($($enum:ident),* $(,)?) => {$(
            if let Some(value) = enums::$enum::from_str_name(name) {
                return Some(value as i32);
            }
        )*};
    }
    lookup!(
        EventType,
        TaskQueueKind,
        TaskQueueType,
        TimeoutType,
        RetryState,
        ContinueAsNewInitiator,
        ContinueAsNewVersioningBehavior,
        SuggestContinueAsNewReason,
        WorkflowTaskFailedCause,
        ActivityTaskFailedCause,
        ParentClosePolicy,
        WorkflowIdReusePolicy,
        StartChildWorkflowExecutionFailedCause,
        SignalExternalWorkflowExecutionFailedCause,
        CancelExternalWorkflowExecutionFailedCause,
        VersioningBehavior,
        WorkerVersioningMode,
        UpdateAdmittedEventOrigin,
        UpdateWorkflowExecutionLifecycleStage,
        WorkflowExecutionStatus,
        PendingActivityState,
        PendingWorkflowTaskState,
        PendingNexusOperationState,
        NexusOperationCancellationState,
        CallbackState,
        VersionDrainageStatus,
        WorkerDeploymentVersionStatus,
        RoutingConfigUpdateState,
        BuildIdTaskReachability,
        TaskReachability,
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use temporalio_common::protos::temporal::api::enums::v1::EventType;
    use temporalio_common::protos::temporal::api::history::v1::history_event::Attributes;

    const STARTED: &str = r#"{"events": [
      {"eventId": "1", "eventTime": "2026-11-21T21:44:12.296037915Z",
       "eventType": "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED", "taskId": "1048587",
       "workflowExecutionStartedEventAttributes": {
         "workflowType": {"name": "rollout"},
         "taskQueue": {"name": "q", "kind": "TASK_QUEUE_KIND_NORMAL"},
         "input": {"payloads": [
           {"metadata": {"encoding": "anNvbi9wbGFpbg=="}, "data": "eyJhIjoxfQ=="}]},
         "workflowTaskTimeout": "10s", "attempt": 1, "header": {}, "workflowId": "w1"}},
      {"eventId": "2", "eventType": "EVENT_TYPE_WORKFLOW_TASK_SCHEDULED",
       "workflowTaskScheduledEventAttributes": {
         "taskQueue": {"name": "q"}, "startToCloseTimeout": "10s", "attempt": 1}}
    ]}"#;

    #[test]
    fn decodes_cli_json() {
        let history = decode_history(STARTED.as_bytes()).expect("sample history decodes");
        assert_eq!(history.events.len(), 2);
        let started = &history.events[0];
        assert_eq!(started.event_id, 1);
        assert_eq!(started.task_id, 1_048_587);
        assert_eq!(started.event_type(), EventType::WorkflowExecutionStarted);
        assert_eq!(
            started.event_time.as_ref().map(|t| (t.seconds, t.nanos)),
            Some((1_795_297_452, 296_037_915))
        );
        let Some(Attributes::WorkflowExecutionStartedEventAttributes(attrs)) = &started.attributes
        else {
            panic!("started attributes: {:?}", started.attributes);
        };
        assert_eq!(
            attrs.workflow_type.as_ref().map(|t| t.name.as_str()),
            Some("rollout")
        );
        assert_eq!(attrs.workflow_id, "w1");
        assert_eq!(attrs.attempt, 1);
        assert_eq!(
            attrs.workflow_task_timeout.as_ref().map(|d| d.seconds),
            Some(10)
        );
        assert_eq!(
            attrs.parent_initiated_event_id, 0,
            "left-out fields are defaults"
        );
        assert!(attrs.parent_workflow_execution.is_none());
        let payload = &attrs.input.as_ref().expect("input").payloads[0];
        assert_eq!(payload.data, br#"{"a":1}"#);
        assert_eq!(
            payload.metadata.get("encoding").map(Vec::as_slice),
            Some(&b"json/plain"[..])
        );
        assert_eq!(
            history.events[1].event_type(),
            EventType::WorkflowTaskScheduled
        );
    }

    #[test]
    fn rejects_unknown_fields() {
        let json = r#"{"events": [{"eventId": "1", "surprise": true}]}"#;
        let error = decode_history(json.as_bytes()).expect_err("unknown field is an error");
        assert!(error.to_string().contains("surprise"), "{error}");
    }
}

//! The OTLP messages weir sends (opentelemetry-proto's `collector/trace/v1`, `trace/v1`,
//! `common/v1`, `resource/v1`), derived by hand with prost: only the fields weir fills, with
//! their field numbers and wire types from the `.proto` files.

/// The method every export calls.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// `ExportTraceServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceRequest {
    /// `resource_spans = 1`.
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

/// `ExportTraceServiceResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceResponse {
    /// `partial_success = 1`.
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportTracePartialSuccess>,
}

/// `ExportTracePartialSuccess`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTracePartialSuccess {
    /// `rejected_spans = 1`.
    #[prost(int64, tag = "1")]
    pub rejected_spans: i64,
    /// `error_message = 2`.
    #[prost(string, tag = "2")]
    pub error_message: String,
}

/// `ResourceSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceSpans {
    /// `resource = 1`.
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    /// `scope_spans = 2`.
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

/// `Resource`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    /// `attributes = 1`.
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

/// `ScopeSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeSpans {
    /// `scope = 1`.
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    /// `spans = 2`.
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
}

/// `InstrumentationScope`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InstrumentationScope {
    /// `name = 1`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `version = 2`.
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `Span`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Span {
    /// `trace_id = 1` (16 bytes).
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    /// `span_id = 2` (8 bytes).
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    /// `trace_state = 3`.
    #[prost(string, tag = "3")]
    pub trace_state: String,
    /// `parent_span_id = 4`; empty for a root span.
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    /// `name = 5`.
    #[prost(string, tag = "5")]
    pub name: String,
    /// `kind = 6` (`SPAN_KIND_SERVER` is 2).
    #[prost(int32, tag = "6")]
    pub kind: i32,
    /// `start_time_unix_nano = 7` (fixed64).
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    /// `end_time_unix_nano = 8` (fixed64).
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    /// `attributes = 9`.
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    /// `status = 15`.
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
    /// `flags = 16` (fixed32): the W3C trace flags in the low byte.
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
}

/// `SPAN_KIND_SERVER`.
pub const SPAN_KIND_SERVER: i32 = 2;
/// `STATUS_CODE_ERROR`.
pub const STATUS_CODE_ERROR: i32 = 2;

/// `Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    /// `message = 2`.
    #[prost(string, tag = "2")]
    pub message: String,
    /// `code = 3` (`STATUS_CODE_UNSET` 0, `OK` 1, `ERROR` 2).
    #[prost(int32, tag = "3")]
    pub code: i32,
}

/// `KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    /// `key = 1`.
    #[prost(string, tag = "1")]
    pub key: String,
    /// `value = 2`.
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `AnyValue`: the two kinds weir sends.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    /// The `value` oneof.
    #[prost(oneof = "Value", tags = "1, 3")]
    pub value: Option<Value>,
}

/// `AnyValue.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    /// `string_value = 1`.
    #[prost(string, tag = "1")]
    String(String),
    /// `int_value = 3`.
    #[prost(int64, tag = "3")]
    Int(i64),
}

/// A string attribute.
pub fn string(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(Value::String(value.into())) }) }
}

/// An integer attribute.
pub fn int(key: &str, value: i64) -> KeyValue {
    KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(Value::Int(value)) }) }
}

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CompressRequest(_message.Message):
    __slots__ = ("id", "context", "context_ids", "document_id", "query", "query_ids", "queries", "queries_ids", "explain", "budget", "ratio", "strategy", "strategy_options", "dca", "layer", "layer_choice", "granularity", "document_ids", "budgets")
    ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_IDS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    QUERY_IDS_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    QUERIES_IDS_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    DCA_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    LAYER_CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    id: str
    context: str
    context_ids: TokenIds
    document_id: str
    query: str
    query_ids: TokenIds
    queries: _containers.RepeatedScalarFieldContainer[str]
    queries_ids: _containers.RepeatedCompositeFieldContainer[TokenIds]
    explain: bool
    budget: int
    ratio: float
    strategy: str
    strategy_options: _struct_pb2.Struct
    dca: str
    layer: int
    layer_choice: str
    granularity: str
    document_ids: _containers.RepeatedScalarFieldContainer[str]
    budgets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[str] = ..., context: _Optional[str] = ..., context_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., document_id: _Optional[str] = ..., query: _Optional[str] = ..., query_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., queries: _Optional[_Iterable[str]] = ..., queries_ids: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ..., explain: _Optional[bool] = ..., budget: _Optional[int] = ..., ratio: _Optional[float] = ..., strategy: _Optional[str] = ..., strategy_options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., dca: _Optional[str] = ..., layer: _Optional[int] = ..., layer_choice: _Optional[str] = ..., granularity: _Optional[str] = ..., document_ids: _Optional[_Iterable[str]] = ..., budgets: _Optional[_Iterable[int]] = ...) -> None: ...

class CompressStreamRequest(_message.Message):
    __slots__ = ("request", "context_text", "context_ids")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TEXT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_IDS_FIELD_NUMBER: _ClassVar[int]
    request: CompressRequest
    context_text: str
    context_ids: TokenIds
    def __init__(self, request: _Optional[_Union[CompressRequest, _Mapping]] = ..., context_text: _Optional[str] = ..., context_ids: _Optional[_Union[TokenIds, _Mapping]] = ...) -> None: ...

class CompressResponse(_message.Message):
    __slots__ = ("id", "token_ids", "kept_indices", "compressed_context", "query", "original_tokens", "compressed_tokens", "ratio", "model", "layer", "strategy", "dca", "passthrough", "timings_ms", "document_id", "explanation", "budget", "granularity", "kept_spans", "fell_back", "resumed_tokens")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    KEPT_INDICES_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    DCA_FIELD_NUMBER: _ClassVar[int]
    PASSTHROUGH_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    KEPT_SPANS_FIELD_NUMBER: _ClassVar[int]
    FELL_BACK_FIELD_NUMBER: _ClassVar[int]
    RESUMED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    kept_indices: _containers.RepeatedScalarFieldContainer[int]
    compressed_context: str
    query: str
    original_tokens: int
    compressed_tokens: int
    ratio: float
    model: str
    layer: int
    strategy: str
    dca: bool
    passthrough: bool
    timings_ms: _containers.ScalarMap[str, float]
    document_id: str
    explanation: str
    budget: int
    granularity: str
    kept_spans: _containers.RepeatedCompositeFieldContainer[Span]
    fell_back: bool
    resumed_tokens: int
    def __init__(self, id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., kept_indices: _Optional[_Iterable[int]] = ..., compressed_context: _Optional[str] = ..., query: _Optional[str] = ..., original_tokens: _Optional[int] = ..., compressed_tokens: _Optional[int] = ..., ratio: _Optional[float] = ..., model: _Optional[str] = ..., layer: _Optional[int] = ..., strategy: _Optional[str] = ..., dca: _Optional[bool] = ..., passthrough: _Optional[bool] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., document_id: _Optional[str] = ..., explanation: _Optional[str] = ..., budget: _Optional[int] = ..., granularity: _Optional[str] = ..., kept_spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., fell_back: _Optional[bool] = ..., resumed_tokens: _Optional[int] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class CompressQueriesResponse(_message.Message):
    __slots__ = ("id", "document_id", "results")
    ID_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    document_id: str
    results: _containers.RepeatedCompositeFieldContainer[CompressResponse]
    def __init__(self, id: _Optional[str] = ..., document_id: _Optional[str] = ..., results: _Optional[_Iterable[_Union[CompressResponse, _Mapping]]] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "layer", "num_layers", "vocab_size", "native_context", "calibrated", "strategies", "default_budget", "max_context_tokens", "max_query_tokens", "sink", "window", "chunk", "queue", "max_message_bytes", "device", "dtype", "layer_choices", "default_strategy", "default_strategy_options", "kernels")
    class LayerChoicesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DefaultStrategyOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class KernelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    NATIVE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    CALIBRATED_FIELD_NUMBER: _ClassVar[int]
    STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SINK_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LAYER_CHOICES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_STRATEGY_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    model: str
    layer: int
    num_layers: int
    vocab_size: int
    native_context: int
    calibrated: bool
    strategies: _containers.RepeatedScalarFieldContainer[str]
    default_budget: int
    max_context_tokens: int
    max_query_tokens: int
    sink: int
    window: int
    chunk: int
    queue: str
    max_message_bytes: int
    device: str
    dtype: str
    layer_choices: _containers.ScalarMap[str, int]
    default_strategy: str
    default_strategy_options: _containers.ScalarMap[str, float]
    kernels: _containers.ScalarMap[str, str]
    def __init__(self, model: _Optional[str] = ..., layer: _Optional[int] = ..., num_layers: _Optional[int] = ..., vocab_size: _Optional[int] = ..., native_context: _Optional[int] = ..., calibrated: _Optional[bool] = ..., strategies: _Optional[_Iterable[str]] = ..., default_budget: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., max_query_tokens: _Optional[int] = ..., sink: _Optional[int] = ..., window: _Optional[int] = ..., chunk: _Optional[int] = ..., queue: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., layer_choices: _Optional[_Mapping[str, int]] = ..., default_strategy: _Optional[str] = ..., default_strategy_options: _Optional[_Mapping[str, float]] = ..., kernels: _Optional[_Mapping[str, str]] = ...) -> None: ...

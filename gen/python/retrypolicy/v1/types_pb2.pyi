import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Category(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CATEGORY_UNSPECIFIED: _ClassVar[Category]
    CATEGORY_TRANSIENT: _ClassVar[Category]
    CATEGORY_TERMINAL: _ClassVar[Category]
    CATEGORY_UNCLASSIFIED: _ClassVar[Category]

class TransportError(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSPORT_ERROR_UNSPECIFIED: _ClassVar[TransportError]
    TRANSPORT_ERROR_TIMEOUT: _ClassVar[TransportError]
    TRANSPORT_ERROR_CONNECTION_RESET: _ClassVar[TransportError]
    TRANSPORT_ERROR_CONNECTION_REFUSED: _ClassVar[TransportError]
    TRANSPORT_ERROR_DNS: _ClassVar[TransportError]
    TRANSPORT_ERROR_TLS: _ClassVar[TransportError]

class LocalError(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOCAL_ERROR_UNSPECIFIED: _ClassVar[LocalError]
    LOCAL_ERROR_PARSE: _ClassVar[LocalError]
    LOCAL_ERROR_VALIDATION: _ClassVar[LocalError]

class Jitter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JITTER_UNSPECIFIED: _ClassVar[Jitter]
    JITTER_NONE: _ClassVar[Jitter]
    JITTER_FULL: _ClassVar[Jitter]
    JITTER_EQUAL: _ClassVar[Jitter]
    JITTER_DECORRELATED: _ClassVar[Jitter]

class RetryAfterMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETRY_AFTER_MODE_UNSPECIFIED: _ClassVar[RetryAfterMode]
    RETRY_AFTER_MODE_MAX: _ClassVar[RetryAfterMode]
    RETRY_AFTER_MODE_OVERRIDE: _ClassVar[RetryAfterMode]

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    DECISION_RETRY: _ClassVar[Decision]
    DECISION_STOP: _ClassVar[Decision]

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_TERMINAL: _ClassVar[StopReason]
    STOP_REASON_NOT_IDEMPOTENT: _ClassVar[StopReason]
    STOP_REASON_ATTEMPTS_EXHAUSTED: _ClassVar[StopReason]
    STOP_REASON_DEADLINE: _ClassVar[StopReason]
    STOP_REASON_BUDGET_EXHAUSTED: _ClassVar[StopReason]
    STOP_REASON_CIRCUIT_OPEN: _ClassVar[StopReason]
    STOP_REASON_SERVER_PUSHBACK: _ClassVar[StopReason]

class Disposition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DISPOSITION_UNSPECIFIED: _ClassVar[Disposition]
    DISPOSITION_SUCCEEDED: _ClassVar[Disposition]
    DISPOSITION_FAILED_TERMINAL: _ClassVar[Disposition]
    DISPOSITION_DEAD_LETTER: _ClassVar[Disposition]
    DISPOSITION_DEADLINE_CUT: _ClassVar[Disposition]
    DISPOSITION_CIRCUIT_OPEN: _ClassVar[Disposition]

class BreakerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BREAKER_STATE_UNSPECIFIED: _ClassVar[BreakerState]
    BREAKER_STATE_CLOSED: _ClassVar[BreakerState]
    BREAKER_STATE_OPEN: _ClassVar[BreakerState]
    BREAKER_STATE_HALF_OPEN: _ClassVar[BreakerState]
    BREAKER_STATE_DISABLED: _ClassVar[BreakerState]

class BreakerMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BREAKER_MODE_UNSPECIFIED: _ClassVar[BreakerMode]
    BREAKER_MODE_CONSECUTIVE: _ClassVar[BreakerMode]
    BREAKER_MODE_FAILURE_RATE: _ClassVar[BreakerMode]

class BreakerScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BREAKER_SCOPE_UNSPECIFIED: _ClassVar[BreakerScope]
    BREAKER_SCOPE_TENANT_TARGET: _ClassVar[BreakerScope]
    BREAKER_SCOPE_TARGET: _ClassVar[BreakerScope]

class AuditEvent(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIT_EVENT_UNSPECIFIED: _ClassVar[AuditEvent]
    AUDIT_EVENT_ADMIT: _ClassVar[AuditEvent]
    AUDIT_EVENT_DECISION: _ClassVar[AuditEvent]
    AUDIT_EVENT_OUTCOME: _ClassVar[AuditEvent]
    AUDIT_EVENT_FINAL: _ClassVar[AuditEvent]

class KeyState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KEY_STATE_UNSPECIFIED: _ClassVar[KeyState]
    KEY_STATE_NEW: _ClassVar[KeyState]
    KEY_STATE_IN_FLIGHT: _ClassVar[KeyState]
    KEY_STATE_SUCCEEDED: _ClassVar[KeyState]
    KEY_STATE_UNKNOWN: _ClassVar[KeyState]

class KeyOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KEY_OUTCOME_UNSPECIFIED: _ClassVar[KeyOutcome]
    KEY_OUTCOME_SUCCEEDED: _ClassVar[KeyOutcome]
    KEY_OUTCOME_FAILED: _ClassVar[KeyOutcome]
    KEY_OUTCOME_UNKNOWN: _ClassVar[KeyOutcome]
CATEGORY_UNSPECIFIED: Category
CATEGORY_TRANSIENT: Category
CATEGORY_TERMINAL: Category
CATEGORY_UNCLASSIFIED: Category
TRANSPORT_ERROR_UNSPECIFIED: TransportError
TRANSPORT_ERROR_TIMEOUT: TransportError
TRANSPORT_ERROR_CONNECTION_RESET: TransportError
TRANSPORT_ERROR_CONNECTION_REFUSED: TransportError
TRANSPORT_ERROR_DNS: TransportError
TRANSPORT_ERROR_TLS: TransportError
LOCAL_ERROR_UNSPECIFIED: LocalError
LOCAL_ERROR_PARSE: LocalError
LOCAL_ERROR_VALIDATION: LocalError
JITTER_UNSPECIFIED: Jitter
JITTER_NONE: Jitter
JITTER_FULL: Jitter
JITTER_EQUAL: Jitter
JITTER_DECORRELATED: Jitter
RETRY_AFTER_MODE_UNSPECIFIED: RetryAfterMode
RETRY_AFTER_MODE_MAX: RetryAfterMode
RETRY_AFTER_MODE_OVERRIDE: RetryAfterMode
DECISION_UNSPECIFIED: Decision
DECISION_RETRY: Decision
DECISION_STOP: Decision
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_TERMINAL: StopReason
STOP_REASON_NOT_IDEMPOTENT: StopReason
STOP_REASON_ATTEMPTS_EXHAUSTED: StopReason
STOP_REASON_DEADLINE: StopReason
STOP_REASON_BUDGET_EXHAUSTED: StopReason
STOP_REASON_CIRCUIT_OPEN: StopReason
STOP_REASON_SERVER_PUSHBACK: StopReason
DISPOSITION_UNSPECIFIED: Disposition
DISPOSITION_SUCCEEDED: Disposition
DISPOSITION_FAILED_TERMINAL: Disposition
DISPOSITION_DEAD_LETTER: Disposition
DISPOSITION_DEADLINE_CUT: Disposition
DISPOSITION_CIRCUIT_OPEN: Disposition
BREAKER_STATE_UNSPECIFIED: BreakerState
BREAKER_STATE_CLOSED: BreakerState
BREAKER_STATE_OPEN: BreakerState
BREAKER_STATE_HALF_OPEN: BreakerState
BREAKER_STATE_DISABLED: BreakerState
BREAKER_MODE_UNSPECIFIED: BreakerMode
BREAKER_MODE_CONSECUTIVE: BreakerMode
BREAKER_MODE_FAILURE_RATE: BreakerMode
BREAKER_SCOPE_UNSPECIFIED: BreakerScope
BREAKER_SCOPE_TENANT_TARGET: BreakerScope
BREAKER_SCOPE_TARGET: BreakerScope
AUDIT_EVENT_UNSPECIFIED: AuditEvent
AUDIT_EVENT_ADMIT: AuditEvent
AUDIT_EVENT_DECISION: AuditEvent
AUDIT_EVENT_OUTCOME: AuditEvent
AUDIT_EVENT_FINAL: AuditEvent
KEY_STATE_UNSPECIFIED: KeyState
KEY_STATE_NEW: KeyState
KEY_STATE_IN_FLIGHT: KeyState
KEY_STATE_SUCCEEDED: KeyState
KEY_STATE_UNKNOWN: KeyState
KEY_OUTCOME_UNSPECIFIED: KeyOutcome
KEY_OUTCOME_SUCCEEDED: KeyOutcome
KEY_OUTCOME_FAILED: KeyOutcome
KEY_OUTCOME_UNKNOWN: KeyOutcome

class CallRef(_message.Message):
    __slots__ = ("tenant", "target", "call_id", "idempotent", "idempotency_key", "run_id", "origin_time", "deadline_time", "triage_ref")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_TIME_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_TIME_FIELD_NUMBER: _ClassVar[int]
    TRIAGE_REF_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    target: str
    call_id: str
    idempotent: bool
    idempotency_key: str
    run_id: str
    origin_time: _timestamp_pb2.Timestamp
    deadline_time: _timestamp_pb2.Timestamp
    triage_ref: str
    def __init__(self, tenant: _Optional[str] = ..., target: _Optional[str] = ..., call_id: _Optional[str] = ..., idempotent: _Optional[bool] = ..., idempotency_key: _Optional[str] = ..., run_id: _Optional[str] = ..., origin_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., triage_ref: _Optional[str] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("http_status", "grpc_code", "transport_error", "local_error")
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    GRPC_CODE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_ERROR_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ERROR_FIELD_NUMBER: _ClassVar[int]
    http_status: int
    grpc_code: int
    transport_error: TransportError
    local_error: LocalError
    def __init__(self, http_status: _Optional[int] = ..., grpc_code: _Optional[int] = ..., transport_error: _Optional[_Union[TransportError, str]] = ..., local_error: _Optional[_Union[LocalError, str]] = ...) -> None: ...

class Pushback(_message.Message):
    __slots__ = ("retry_after", "grpc_retry_pushback_ms", "x_ratelimit_reset", "x_amz_retry_after")
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    GRPC_RETRY_PUSHBACK_MS_FIELD_NUMBER: _ClassVar[int]
    X_RATELIMIT_RESET_FIELD_NUMBER: _ClassVar[int]
    X_AMZ_RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    retry_after: str
    grpc_retry_pushback_ms: str
    x_ratelimit_reset: str
    x_amz_retry_after: str
    def __init__(self, retry_after: _Optional[str] = ..., grpc_retry_pushback_ms: _Optional[str] = ..., x_ratelimit_reset: _Optional[str] = ..., x_amz_retry_after: _Optional[str] = ...) -> None: ...

class BackoffSettings(_message.Message):
    __slots__ = ("base_delay", "factor", "max_delay", "jitter")
    BASE_DELAY_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    MAX_DELAY_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    base_delay: _duration_pb2.Duration
    factor: float
    max_delay: _duration_pb2.Duration
    jitter: Jitter
    def __init__(self, base_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., factor: _Optional[float] = ..., max_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., jitter: _Optional[_Union[Jitter, str]] = ...) -> None: ...

class PushbackSettings(_message.Message):
    __slots__ = ("mode", "spread_ratio", "min_spread", "max_hint")
    MODE_FIELD_NUMBER: _ClassVar[int]
    SPREAD_RATIO_FIELD_NUMBER: _ClassVar[int]
    MIN_SPREAD_FIELD_NUMBER: _ClassVar[int]
    MAX_HINT_FIELD_NUMBER: _ClassVar[int]
    mode: RetryAfterMode
    spread_ratio: float
    min_spread: _duration_pb2.Duration
    max_hint: _duration_pb2.Duration
    def __init__(self, mode: _Optional[_Union[RetryAfterMode, str]] = ..., spread_ratio: _Optional[float] = ..., min_spread: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_hint: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class BreakerSettings(_message.Message):
    __slots__ = ("mode", "scope", "consecutive_failures", "failure_rate", "window", "min_calls", "cooldown", "half_open_probes", "probe_timeout", "count_pushback")
    MODE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    FAILURE_RATE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    MIN_CALLS_FIELD_NUMBER: _ClassVar[int]
    COOLDOWN_FIELD_NUMBER: _ClassVar[int]
    HALF_OPEN_PROBES_FIELD_NUMBER: _ClassVar[int]
    PROBE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    COUNT_PUSHBACK_FIELD_NUMBER: _ClassVar[int]
    mode: BreakerMode
    scope: BreakerScope
    consecutive_failures: int
    failure_rate: float
    window: _duration_pb2.Duration
    min_calls: int
    cooldown: _duration_pb2.Duration
    half_open_probes: int
    probe_timeout: _duration_pb2.Duration
    count_pushback: bool
    def __init__(self, mode: _Optional[_Union[BreakerMode, str]] = ..., scope: _Optional[_Union[BreakerScope, str]] = ..., consecutive_failures: _Optional[int] = ..., failure_rate: _Optional[float] = ..., window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., min_calls: _Optional[int] = ..., cooldown: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., half_open_probes: _Optional[int] = ..., probe_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., count_pushback: _Optional[bool] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("backoff", "pushback", "max_attempts", "attempt_timeout", "call_deadline", "transient_http_statuses", "terminal_http_statuses", "transient_grpc_codes", "breaker", "idempotency_ttl", "upstream_dedupes_by_key", "flow", "fallback")
    BACKOFF_FIELD_NUMBER: _ClassVar[int]
    PUSHBACK_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    CALL_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    TRANSIENT_HTTP_STATUSES_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_HTTP_STATUSES_FIELD_NUMBER: _ClassVar[int]
    TRANSIENT_GRPC_CODES_FIELD_NUMBER: _ClassVar[int]
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_TTL_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_DEDUPES_BY_KEY_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    backoff: BackoffSettings
    pushback: PushbackSettings
    max_attempts: int
    attempt_timeout: _duration_pb2.Duration
    call_deadline: _duration_pb2.Duration
    transient_http_statuses: _containers.RepeatedScalarFieldContainer[int]
    terminal_http_statuses: _containers.RepeatedScalarFieldContainer[int]
    transient_grpc_codes: _containers.RepeatedScalarFieldContainer[int]
    breaker: BreakerSettings
    idempotency_ttl: _duration_pb2.Duration
    upstream_dedupes_by_key: bool
    flow: FlowSettings
    fallback: FallbackSettings
    def __init__(self, backoff: _Optional[_Union[BackoffSettings, _Mapping]] = ..., pushback: _Optional[_Union[PushbackSettings, _Mapping]] = ..., max_attempts: _Optional[int] = ..., attempt_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., call_deadline: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., transient_http_statuses: _Optional[_Iterable[int]] = ..., terminal_http_statuses: _Optional[_Iterable[int]] = ..., transient_grpc_codes: _Optional[_Iterable[int]] = ..., breaker: _Optional[_Union[BreakerSettings, _Mapping]] = ..., idempotency_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., upstream_dedupes_by_key: _Optional[bool] = ..., flow: _Optional[_Union[FlowSettings, _Mapping]] = ..., fallback: _Optional[_Union[FallbackSettings, _Mapping]] = ...) -> None: ...

class FallbackSettings(_message.Message):
    __slots__ = ("targets", "after_attempts", "on_circuit_open")
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    AFTER_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ON_CIRCUIT_OPEN_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedScalarFieldContainer[str]
    after_attempts: int
    on_circuit_open: bool
    def __init__(self, targets: _Optional[_Iterable[str]] = ..., after_attempts: _Optional[int] = ..., on_circuit_open: _Optional[bool] = ...) -> None: ...

class FlowSettings(_message.Message):
    __slots__ = ("max_in_flight", "lease_slack", "max_rate", "burst", "adaptive")
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LEASE_SLACK_FIELD_NUMBER: _ClassVar[int]
    MAX_RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_FIELD_NUMBER: _ClassVar[int]
    max_in_flight: int
    lease_slack: _duration_pb2.Duration
    max_rate: float
    burst: int
    adaptive: AdaptiveCeiling
    def __init__(self, max_in_flight: _Optional[int] = ..., lease_slack: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_rate: _Optional[float] = ..., burst: _Optional[int] = ..., adaptive: _Optional[_Union[AdaptiveCeiling, _Mapping]] = ...) -> None: ...

class AdaptiveCeiling(_message.Message):
    __slots__ = ("min_in_flight", "decrease", "increase", "hold")
    MIN_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DECREASE_FIELD_NUMBER: _ClassVar[int]
    INCREASE_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    min_in_flight: int
    decrease: float
    increase: float
    hold: _duration_pb2.Duration
    def __init__(self, min_in_flight: _Optional[int] = ..., decrease: _Optional[float] = ..., increase: _Optional[float] = ..., hold: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class BudgetPlan(_message.Message):
    __slots__ = ("max_attempts", "delays", "worst_case_total", "idempotency_ttl", "window", "remaining", "usable", "reason")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DELAYS_FIELD_NUMBER: _ClassVar[int]
    WORST_CASE_TOTAL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_TTL_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    USABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    delays: _containers.RepeatedCompositeFieldContainer[_duration_pb2.Duration]
    worst_case_total: _duration_pb2.Duration
    idempotency_ttl: _duration_pb2.Duration
    window: _duration_pb2.Duration
    remaining: _duration_pb2.Duration
    usable: _duration_pb2.Duration
    reason: str
    def __init__(self, max_attempts: _Optional[int] = ..., delays: _Optional[_Iterable[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]]] = ..., worst_case_total: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., idempotency_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., remaining: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., usable: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class BreakerKey(_message.Message):
    __slots__ = ("tenant", "target")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    target: str
    def __init__(self, tenant: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class Breaker(_message.Message):
    __slots__ = ("key", "state", "forced", "open_until_time", "consecutive_failures", "window_calls", "window_failures", "probes_in_flight", "change_time", "cooldown_until_time", "mode", "leases_in_flight", "stray_releases", "ceiling", "adaptive_limit", "degraded")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FORCED_FIELD_NUMBER: _ClassVar[int]
    OPEN_UNTIL_TIME_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_CALLS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FAILURES_FIELD_NUMBER: _ClassVar[int]
    PROBES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    CHANGE_TIME_FIELD_NUMBER: _ClassVar[int]
    COOLDOWN_UNTIL_TIME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LEASES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    STRAY_RELEASES_FIELD_NUMBER: _ClassVar[int]
    CEILING_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    key: BreakerKey
    state: BreakerState
    forced: bool
    open_until_time: _timestamp_pb2.Timestamp
    consecutive_failures: int
    window_calls: int
    window_failures: int
    probes_in_flight: int
    change_time: _timestamp_pb2.Timestamp
    cooldown_until_time: _timestamp_pb2.Timestamp
    mode: BreakerMode
    leases_in_flight: int
    stray_releases: int
    ceiling: int
    adaptive_limit: float
    degraded: bool
    def __init__(self, key: _Optional[_Union[BreakerKey, _Mapping]] = ..., state: _Optional[_Union[BreakerState, str]] = ..., forced: _Optional[bool] = ..., open_until_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., consecutive_failures: _Optional[int] = ..., window_calls: _Optional[int] = ..., window_failures: _Optional[int] = ..., probes_in_flight: _Optional[int] = ..., change_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cooldown_until_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., mode: _Optional[_Union[BreakerMode, str]] = ..., leases_in_flight: _Optional[int] = ..., stray_releases: _Optional[int] = ..., ceiling: _Optional[int] = ..., adaptive_limit: _Optional[float] = ..., degraded: _Optional[bool] = ...) -> None: ...

class TenantBudget(_message.Message):
    __slots__ = ("tenant", "capacity", "deposit_ratio", "min_retries_per_second", "retry_cost", "timeout_cost", "dry_run")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    DEPOSIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    MIN_RETRIES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    RETRY_COST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_COST_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    capacity: float
    deposit_ratio: float
    min_retries_per_second: float
    retry_cost: float
    timeout_cost: float
    dry_run: bool
    def __init__(self, tenant: _Optional[str] = ..., capacity: _Optional[float] = ..., deposit_ratio: _Optional[float] = ..., min_retries_per_second: _Optional[float] = ..., retry_cost: _Optional[float] = ..., timeout_cost: _Optional[float] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class TenantBudgetStatus(_message.Message):
    __slots__ = ("budget", "tokens", "retries_granted", "retries_refused", "dry_run_refusals", "is_default")
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETRIES_GRANTED_FIELD_NUMBER: _ClassVar[int]
    RETRIES_REFUSED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    budget: TenantBudget
    tokens: float
    retries_granted: int
    retries_refused: int
    dry_run_refusals: int
    is_default: bool
    def __init__(self, budget: _Optional[_Union[TenantBudget, _Mapping]] = ..., tokens: _Optional[float] = ..., retries_granted: _Optional[int] = ..., retries_refused: _Optional[int] = ..., dry_run_refusals: _Optional[int] = ..., is_default: _Optional[bool] = ...) -> None: ...

class PolicyEntry(_message.Message):
    __slots__ = ("tenant", "target", "policy", "update_time")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    target: str
    policy: Policy
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, tenant: _Optional[str] = ..., target: _Optional[str] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RunLedger(_message.Message):
    __slots__ = ("succeeded", "failed_terminal", "dead_letter_exhausted", "dead_letter_budget", "dead_letter_not_idempotent", "dead_letter_pushback", "circuit_open", "deadline_cut", "dead_letter_deadline", "deduplicated")
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_TERMINAL_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_NOT_IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_PUSHBACK_FIELD_NUMBER: _ClassVar[int]
    CIRCUIT_OPEN_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_CUT_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    succeeded: int
    failed_terminal: int
    dead_letter_exhausted: int
    dead_letter_budget: int
    dead_letter_not_idempotent: int
    dead_letter_pushback: int
    circuit_open: int
    deadline_cut: int
    dead_letter_deadline: int
    deduplicated: int
    def __init__(self, succeeded: _Optional[int] = ..., failed_terminal: _Optional[int] = ..., dead_letter_exhausted: _Optional[int] = ..., dead_letter_budget: _Optional[int] = ..., dead_letter_not_idempotent: _Optional[int] = ..., dead_letter_pushback: _Optional[int] = ..., circuit_open: _Optional[int] = ..., deadline_cut: _Optional[int] = ..., dead_letter_deadline: _Optional[int] = ..., deduplicated: _Optional[int] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "tenant", "retry_pool", "retries_spent", "cutoff_time", "create_time", "ledger", "description", "redrive_of")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RETRY_POOL_FIELD_NUMBER: _ClassVar[int]
    RETRIES_SPENT_FIELD_NUMBER: _ClassVar[int]
    CUTOFF_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REDRIVE_OF_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant: str
    retry_pool: int
    retries_spent: int
    cutoff_time: _timestamp_pb2.Timestamp
    create_time: _timestamp_pb2.Timestamp
    ledger: RunLedger
    description: str
    redrive_of: str
    def __init__(self, run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., retry_pool: _Optional[int] = ..., retries_spent: _Optional[int] = ..., cutoff_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ledger: _Optional[_Union[RunLedger, _Mapping]] = ..., description: _Optional[str] = ..., redrive_of: _Optional[str] = ...) -> None: ...

class RunCall(_message.Message):
    __slots__ = ("call_id", "disposition", "stop_reason", "attempts", "last_classification", "last_detail", "first_attempt_time", "last_attempt_time", "target", "triage_ref", "primary_target")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    DISPOSITION_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_CLASSIFICATION_FIELD_NUMBER: _ClassVar[int]
    LAST_DETAIL_FIELD_NUMBER: _ClassVar[int]
    FIRST_ATTEMPT_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_ATTEMPT_TIME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TRIAGE_REF_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_TARGET_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    disposition: Disposition
    stop_reason: StopReason
    attempts: int
    last_classification: str
    last_detail: str
    first_attempt_time: _timestamp_pb2.Timestamp
    last_attempt_time: _timestamp_pb2.Timestamp
    target: str
    triage_ref: str
    primary_target: str
    def __init__(self, call_id: _Optional[str] = ..., disposition: _Optional[_Union[Disposition, str]] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., attempts: _Optional[int] = ..., last_classification: _Optional[str] = ..., last_detail: _Optional[str] = ..., first_attempt_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_attempt_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., target: _Optional[str] = ..., triage_ref: _Optional[str] = ..., primary_target: _Optional[str] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("record_time", "event", "tenant", "target", "call_id", "run_id", "attempt", "classification", "decision", "delay", "stop_reason", "disposition", "detail", "primary_target")
    RECORD_TIME_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CLASSIFICATION_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    DISPOSITION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_TARGET_FIELD_NUMBER: _ClassVar[int]
    record_time: _timestamp_pb2.Timestamp
    event: AuditEvent
    tenant: str
    target: str
    call_id: str
    run_id: str
    attempt: int
    classification: str
    decision: Decision
    delay: _duration_pb2.Duration
    stop_reason: StopReason
    disposition: Disposition
    detail: str
    primary_target: str
    def __init__(self, record_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., event: _Optional[_Union[AuditEvent, str]] = ..., tenant: _Optional[str] = ..., target: _Optional[str] = ..., call_id: _Optional[str] = ..., run_id: _Optional[str] = ..., attempt: _Optional[int] = ..., classification: _Optional[str] = ..., decision: _Optional[_Union[Decision, str]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., disposition: _Optional[_Union[Disposition, str]] = ..., detail: _Optional[str] = ..., primary_target: _Optional[str] = ...) -> None: ...

class IdempotencyRecord(_message.Message):
    __slots__ = ("tenant", "idempotency_key", "state", "lease_expire_time", "expire_time", "result_ref")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    RESULT_REF_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    idempotency_key: str
    state: KeyState
    lease_expire_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    result_ref: str
    def __init__(self, tenant: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., state: _Optional[_Union[KeyState, str]] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., result_ref: _Optional[str] = ...) -> None: ...

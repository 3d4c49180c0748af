import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from retrypolicy.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClassifyRequest(_message.Message):
    __slots__ = ("call", "failure")
    CALL_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    call: _types_pb2.CallRef
    failure: _types_pb2.Failure
    def __init__(self, call: _Optional[_Union[_types_pb2.CallRef, _Mapping]] = ..., failure: _Optional[_Union[_types_pb2.Failure, _Mapping]] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("retryable", "category", "reason")
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    retryable: bool
    category: _types_pb2.Category
    reason: str
    def __init__(self, retryable: _Optional[bool] = ..., category: _Optional[_Union[_types_pb2.Category, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class NextDelayRequest(_message.Message):
    __slots__ = ("call", "attempt", "failure", "pushback", "previous_delay", "permit_id", "lease_id", "attempt_target")
    CALL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    PUSHBACK_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_DELAY_FIELD_NUMBER: _ClassVar[int]
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TARGET_FIELD_NUMBER: _ClassVar[int]
    call: _types_pb2.CallRef
    attempt: int
    failure: _types_pb2.Failure
    pushback: _types_pb2.Pushback
    previous_delay: _duration_pb2.Duration
    permit_id: str
    lease_id: str
    attempt_target: str
    def __init__(self, call: _Optional[_Union[_types_pb2.CallRef, _Mapping]] = ..., attempt: _Optional[int] = ..., failure: _Optional[_Union[_types_pb2.Failure, _Mapping]] = ..., pushback: _Optional[_Union[_types_pb2.Pushback, _Mapping]] = ..., previous_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., permit_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., attempt_target: _Optional[str] = ...) -> None: ...

class NextDelayResponse(_message.Message):
    __slots__ = ("decision", "delay", "stop_reason", "disposition", "category", "classification", "pushback_note", "attempt_timeout", "breaker_state", "tenant_budget_remaining", "run_budget_remaining", "checks", "detail", "flow_controlled", "degraded", "target")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    DISPOSITION_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    CLASSIFICATION_FIELD_NUMBER: _ClassVar[int]
    PUSHBACK_NOTE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    BREAKER_STATE_FIELD_NUMBER: _ClassVar[int]
    TENANT_BUDGET_REMAINING_FIELD_NUMBER: _ClassVar[int]
    RUN_BUDGET_REMAINING_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    FLOW_CONTROLLED_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    decision: _types_pb2.Decision
    delay: _duration_pb2.Duration
    stop_reason: _types_pb2.StopReason
    disposition: _types_pb2.Disposition
    category: _types_pb2.Category
    classification: str
    pushback_note: str
    attempt_timeout: _duration_pb2.Duration
    breaker_state: _types_pb2.BreakerState
    tenant_budget_remaining: float
    run_budget_remaining: int
    checks: _containers.RepeatedScalarFieldContainer[str]
    detail: str
    flow_controlled: bool
    degraded: bool
    target: str
    def __init__(self, decision: _Optional[_Union[_types_pb2.Decision, str]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., stop_reason: _Optional[_Union[_types_pb2.StopReason, str]] = ..., disposition: _Optional[_Union[_types_pb2.Disposition, str]] = ..., category: _Optional[_Union[_types_pb2.Category, str]] = ..., classification: _Optional[str] = ..., pushback_note: _Optional[str] = ..., attempt_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., breaker_state: _Optional[_Union[_types_pb2.BreakerState, str]] = ..., tenant_budget_remaining: _Optional[float] = ..., run_budget_remaining: _Optional[int] = ..., checks: _Optional[_Iterable[str]] = ..., detail: _Optional[str] = ..., flow_controlled: _Optional[bool] = ..., degraded: _Optional[bool] = ..., target: _Optional[str] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("call", "attempt", "success", "failure", "latency", "permit_id", "final_disposition", "final_stop_reason", "already_recorded", "lease_id", "deduplicated", "attempt_target")
    CALL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    FINAL_DISPOSITION_FIELD_NUMBER: _ClassVar[int]
    FINAL_STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    ALREADY_RECORDED_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TARGET_FIELD_NUMBER: _ClassVar[int]
    call: _types_pb2.CallRef
    attempt: int
    success: bool
    failure: _types_pb2.Failure
    latency: _duration_pb2.Duration
    permit_id: str
    final_disposition: _types_pb2.Disposition
    final_stop_reason: _types_pb2.StopReason
    already_recorded: bool
    lease_id: str
    deduplicated: bool
    attempt_target: str
    def __init__(self, call: _Optional[_Union[_types_pb2.CallRef, _Mapping]] = ..., attempt: _Optional[int] = ..., success: _Optional[bool] = ..., failure: _Optional[_Union[_types_pb2.Failure, _Mapping]] = ..., latency: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., permit_id: _Optional[str] = ..., final_disposition: _Optional[_Union[_types_pb2.Disposition, str]] = ..., final_stop_reason: _Optional[_Union[_types_pb2.StopReason, str]] = ..., already_recorded: _Optional[bool] = ..., lease_id: _Optional[str] = ..., deduplicated: _Optional[bool] = ..., attempt_target: _Optional[str] = ...) -> None: ...

class ReportOutcomeRequest(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[Outcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[Outcome, _Mapping]]] = ...) -> None: ...

class ReportOutcomeResponse(_message.Message):
    __slots__ = ("accepted", "refused", "flow_controlled_targets", "fallback_chains")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    FLOW_CONTROLLED_TARGETS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_CHAINS_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    refused: _containers.RepeatedCompositeFieldContainer[OutcomeRefusal]
    flow_controlled_targets: _containers.RepeatedScalarFieldContainer[str]
    fallback_chains: _containers.RepeatedCompositeFieldContainer[FallbackChain]
    def __init__(self, accepted: _Optional[int] = ..., refused: _Optional[_Iterable[_Union[OutcomeRefusal, _Mapping]]] = ..., flow_controlled_targets: _Optional[_Iterable[str]] = ..., fallback_chains: _Optional[_Iterable[_Union[FallbackChain, _Mapping]]] = ...) -> None: ...

class OutcomeRefusal(_message.Message):
    __slots__ = ("index", "code", "field", "message")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    code: int
    field: str
    message: str
    def __init__(self, index: _Optional[int] = ..., code: _Optional[int] = ..., field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("call", "attempt", "attempt_target")
    CALL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TARGET_FIELD_NUMBER: _ClassVar[int]
    call: _types_pb2.CallRef
    attempt: int
    attempt_target: str
    def __init__(self, call: _Optional[_Union[_types_pb2.CallRef, _Mapping]] = ..., attempt: _Optional[int] = ..., attempt_target: _Optional[str] = ...) -> None: ...

class AdmitResponse(_message.Message):
    __slots__ = ("admitted", "state", "permit_id", "retry_after", "reason", "run_cutoff_time", "lease_id", "lease_expire_time", "flow_controlled", "degraded", "target")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_CUTOFF_TIME_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    FLOW_CONTROLLED_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    admitted: bool
    state: _types_pb2.BreakerState
    permit_id: str
    retry_after: _duration_pb2.Duration
    reason: str
    run_cutoff_time: _timestamp_pb2.Timestamp
    lease_id: str
    lease_expire_time: _timestamp_pb2.Timestamp
    flow_controlled: bool
    degraded: bool
    target: str
    def __init__(self, admitted: _Optional[bool] = ..., state: _Optional[_Union[_types_pb2.BreakerState, str]] = ..., permit_id: _Optional[str] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ..., run_cutoff_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_id: _Optional[str] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., flow_controlled: _Optional[bool] = ..., degraded: _Optional[bool] = ..., target: _Optional[str] = ...) -> None: ...

class ReleaseLeaseRequest(_message.Message):
    __slots__ = ("call", "lease_id", "attempt_target")
    CALL_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TARGET_FIELD_NUMBER: _ClassVar[int]
    call: _types_pb2.CallRef
    lease_id: str
    attempt_target: str
    def __init__(self, call: _Optional[_Union[_types_pb2.CallRef, _Mapping]] = ..., lease_id: _Optional[str] = ..., attempt_target: _Optional[str] = ...) -> None: ...

class ReleaseLeaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class WatchBreakersRequest(_message.Message):
    __slots__ = ("tenant", "resume_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    resume_token: str
    def __init__(self, tenant: _Optional[str] = ..., resume_token: _Optional[str] = ...) -> None: ...

class WatchBreakersResponse(_message.Message):
    __slots__ = ("breaker", "snapshot", "snapshot_complete", "flow_controlled_targets", "uncontrolled_targets", "other_targets_flow_controlled", "fallback_chains", "other_targets_fallback", "resume_token", "resumed")
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    FLOW_CONTROLLED_TARGETS_FIELD_NUMBER: _ClassVar[int]
    UNCONTROLLED_TARGETS_FIELD_NUMBER: _ClassVar[int]
    OTHER_TARGETS_FLOW_CONTROLLED_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_CHAINS_FIELD_NUMBER: _ClassVar[int]
    OTHER_TARGETS_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    breaker: _types_pb2.Breaker
    snapshot: bool
    snapshot_complete: bool
    flow_controlled_targets: _containers.RepeatedScalarFieldContainer[str]
    uncontrolled_targets: _containers.RepeatedScalarFieldContainer[str]
    other_targets_flow_controlled: bool
    fallback_chains: _containers.RepeatedCompositeFieldContainer[FallbackChain]
    other_targets_fallback: _types_pb2.FallbackSettings
    resume_token: str
    resumed: bool
    def __init__(self, breaker: _Optional[_Union[_types_pb2.Breaker, _Mapping]] = ..., snapshot: _Optional[bool] = ..., snapshot_complete: _Optional[bool] = ..., flow_controlled_targets: _Optional[_Iterable[str]] = ..., uncontrolled_targets: _Optional[_Iterable[str]] = ..., other_targets_flow_controlled: _Optional[bool] = ..., fallback_chains: _Optional[_Iterable[_Union[FallbackChain, _Mapping]]] = ..., other_targets_fallback: _Optional[_Union[_types_pb2.FallbackSettings, _Mapping]] = ..., resume_token: _Optional[str] = ..., resumed: _Optional[bool] = ...) -> None: ...

class FallbackChain(_message.Message):
    __slots__ = ("target", "fallback")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    target: str
    fallback: _types_pb2.FallbackSettings
    def __init__(self, target: _Optional[str] = ..., fallback: _Optional[_Union[_types_pb2.FallbackSettings, _Mapping]] = ...) -> None: ...

class PlanBudgetRequest(_message.Message):
    __slots__ = ("window", "backoff", "attempt_timeout", "ttl_margin", "max_attempts", "hops", "origin_time", "reserve")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TTL_MARGIN_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_TIME_FIELD_NUMBER: _ClassVar[int]
    RESERVE_FIELD_NUMBER: _ClassVar[int]
    window: _duration_pb2.Duration
    backoff: _types_pb2.BackoffSettings
    attempt_timeout: _duration_pb2.Duration
    ttl_margin: _duration_pb2.Duration
    max_attempts: int
    hops: int
    origin_time: _timestamp_pb2.Timestamp
    reserve: float
    def __init__(self, window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff: _Optional[_Union[_types_pb2.BackoffSettings, _Mapping]] = ..., attempt_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., ttl_margin: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_attempts: _Optional[int] = ..., hops: _Optional[int] = ..., origin_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reserve: _Optional[float] = ...) -> None: ...

class PlanBudgetResponse(_message.Message):
    __slots__ = ("plan", "hops")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    plan: _types_pb2.BudgetPlan
    hops: _containers.RepeatedCompositeFieldContainer[_types_pb2.BudgetPlan]
    def __init__(self, plan: _Optional[_Union[_types_pb2.BudgetPlan, _Mapping]] = ..., hops: _Optional[_Iterable[_Union[_types_pb2.BudgetPlan, _Mapping]]] = ...) -> None: ...

class ClaimKeyRequest(_message.Message):
    __slots__ = ("call", "attempt")
    CALL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    call: _types_pb2.CallRef
    attempt: int
    def __init__(self, call: _Optional[_Union[_types_pb2.CallRef, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class ClaimKeyResponse(_message.Message):
    __slots__ = ("state", "lease_id", "lease_expire_time", "result_ref", "retry_after", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    RESULT_REF_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: _types_pb2.KeyState
    lease_id: str
    lease_expire_time: _timestamp_pb2.Timestamp
    result_ref: str
    retry_after: _duration_pb2.Duration
    reason: str
    def __init__(self, state: _Optional[_Union[_types_pb2.KeyState, str]] = ..., lease_id: _Optional[str] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., result_ref: _Optional[str] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class CompleteKeyRequest(_message.Message):
    __slots__ = ("tenant", "idempotency_key", "lease_id", "outcome", "result_ref")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RESULT_REF_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    idempotency_key: str
    lease_id: str
    outcome: _types_pb2.KeyOutcome
    result_ref: str
    def __init__(self, tenant: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., lease_id: _Optional[str] = ..., outcome: _Optional[_Union[_types_pb2.KeyOutcome, str]] = ..., result_ref: _Optional[str] = ...) -> None: ...

class CompleteKeyResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: _types_pb2.IdempotencyRecord
    def __init__(self, record: _Optional[_Union[_types_pb2.IdempotencyRecord, _Mapping]] = ...) -> None: ...

class GetKeyRequest(_message.Message):
    __slots__ = ("tenant", "idempotency_key")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    idempotency_key: str
    def __init__(self, tenant: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class GetKeyResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: _types_pb2.IdempotencyRecord
    def __init__(self, record: _Optional[_Union[_types_pb2.IdempotencyRecord, _Mapping]] = ...) -> None: ...

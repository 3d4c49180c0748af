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

class SetTenantBudgetRequest(_message.Message):
    __slots__ = ("budget",)
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    budget: _types_pb2.TenantBudget
    def __init__(self, budget: _Optional[_Union[_types_pb2.TenantBudget, _Mapping]] = ...) -> None: ...

class SetTenantBudgetResponse(_message.Message):
    __slots__ = ("budget",)
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    budget: _types_pb2.TenantBudget
    def __init__(self, budget: _Optional[_Union[_types_pb2.TenantBudget, _Mapping]] = ...) -> None: ...

class GetTenantBudgetRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class GetTenantBudgetResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _types_pb2.TenantBudgetStatus
    def __init__(self, status: _Optional[_Union[_types_pb2.TenantBudgetStatus, _Mapping]] = ...) -> None: ...

class ListTenantBudgetsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTenantBudgetsResponse(_message.Message):
    __slots__ = ("budgets", "next_page_token")
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    budgets: _containers.RepeatedCompositeFieldContainer[_types_pb2.TenantBudgetStatus]
    next_page_token: str
    def __init__(self, budgets: _Optional[_Iterable[_Union[_types_pb2.TenantBudgetStatus, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteTenantBudgetRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class DeleteTenantBudgetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetPolicyRequest(_message.Message):
    __slots__ = ("tenant", "target", "policy")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    target: str
    policy: _types_pb2.Policy
    def __init__(self, tenant: _Optional[str] = ..., target: _Optional[str] = ..., policy: _Optional[_Union[_types_pb2.Policy, _Mapping]] = ...) -> None: ...

class SetPolicyResponse(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: _types_pb2.PolicyEntry
    def __init__(self, entry: _Optional[_Union[_types_pb2.PolicyEntry, _Mapping]] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ("tenant", "target", "effective")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    target: str
    effective: bool
    def __init__(self, tenant: _Optional[str] = ..., target: _Optional[str] = ..., effective: _Optional[bool] = ...) -> None: ...

class GetPolicyResponse(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: _types_pb2.PolicyEntry
    def __init__(self, entry: _Optional[_Union[_types_pb2.PolicyEntry, _Mapping]] = ...) -> None: ...

class ListPoliciesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPoliciesResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_types_pb2.PolicyEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[_types_pb2.PolicyEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeletePolicyRequest(_message.Message):
    __slots__ = ("tenant", "target")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    target: str
    def __init__(self, tenant: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class DeletePolicyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBreakersRequest(_message.Message):
    __slots__ = ("tenant", "state", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    state: _types_pb2.BreakerState
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., state: _Optional[_Union[_types_pb2.BreakerState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListBreakersResponse(_message.Message):
    __slots__ = ("breakers", "next_page_token")
    BREAKERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    breakers: _containers.RepeatedCompositeFieldContainer[_types_pb2.Breaker]
    next_page_token: str
    def __init__(self, breakers: _Optional[_Iterable[_Union[_types_pb2.Breaker, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetBreakerRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: _types_pb2.BreakerKey
    def __init__(self, key: _Optional[_Union[_types_pb2.BreakerKey, _Mapping]] = ...) -> None: ...

class GetBreakerResponse(_message.Message):
    __slots__ = ("breaker",)
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    breaker: _types_pb2.Breaker
    def __init__(self, breaker: _Optional[_Union[_types_pb2.Breaker, _Mapping]] = ...) -> None: ...

class ResetBreakerRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: _types_pb2.BreakerKey
    def __init__(self, key: _Optional[_Union[_types_pb2.BreakerKey, _Mapping]] = ...) -> None: ...

class ResetBreakerResponse(_message.Message):
    __slots__ = ("breaker",)
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    breaker: _types_pb2.Breaker
    def __init__(self, breaker: _Optional[_Union[_types_pb2.Breaker, _Mapping]] = ...) -> None: ...

class ForceBreakerRequest(_message.Message):
    __slots__ = ("key", "state")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    key: _types_pb2.BreakerKey
    state: _types_pb2.BreakerState
    def __init__(self, key: _Optional[_Union[_types_pb2.BreakerKey, _Mapping]] = ..., state: _Optional[_Union[_types_pb2.BreakerState, str]] = ...) -> None: ...

class ForceBreakerResponse(_message.Message):
    __slots__ = ("breaker",)
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    breaker: _types_pb2.Breaker
    def __init__(self, breaker: _Optional[_Union[_types_pb2.Breaker, _Mapping]] = ...) -> None: ...

class OpenRunRequest(_message.Message):
    __slots__ = ("run_id", "tenant", "retry_pool", "cutoff_time", "description", "redrive_of")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RETRY_POOL_FIELD_NUMBER: _ClassVar[int]
    CUTOFF_TIME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REDRIVE_OF_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant: str
    retry_pool: int
    cutoff_time: _timestamp_pb2.Timestamp
    description: str
    redrive_of: str
    def __init__(self, run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., retry_pool: _Optional[int] = ..., cutoff_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., description: _Optional[str] = ..., redrive_of: _Optional[str] = ...) -> None: ...

class OpenRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _types_pb2.Run
    def __init__(self, run: _Optional[_Union[_types_pb2.Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("tenant", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[_types_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListRunCallsRequest(_message.Message):
    __slots__ = ("run_id", "tenant", "dispositions", "stop_reasons", "page_size", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DISPOSITIONS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASONS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant: str
    dispositions: _containers.RepeatedScalarFieldContainer[_types_pb2.Disposition]
    stop_reasons: _containers.RepeatedScalarFieldContainer[_types_pb2.StopReason]
    page_size: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., dispositions: _Optional[_Iterable[_Union[_types_pb2.Disposition, str]]] = ..., stop_reasons: _Optional[_Iterable[_Union[_types_pb2.StopReason, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunCallsResponse(_message.Message):
    __slots__ = ("calls", "next_page_token", "untracked")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    UNTRACKED_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[_types_pb2.RunCall]
    next_page_token: str
    untracked: int
    def __init__(self, calls: _Optional[_Iterable[_Union[_types_pb2.RunCall, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., untracked: _Optional[int] = ...) -> None: ...

class QueryAuditRequest(_message.Message):
    __slots__ = ("call_id", "tenant", "start_time", "end_time", "page_size", "page_token")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    tenant: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    def __init__(self, call_id: _Optional[str] = ..., tenant: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class QueryAuditResponse(_message.Message):
    __slots__ = ("records", "next_page_token")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[_types_pb2.AuditRecord]
    next_page_token: str
    def __init__(self, records: _Optional[_Iterable[_Union[_types_pb2.AuditRecord, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AdviseTargetsRequest(_message.Message):
    __slots__ = ("tenant", "target", "since")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    target: str
    since: _duration_pb2.Duration
    def __init__(self, tenant: _Optional[str] = ..., target: _Optional[str] = ..., since: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AdviseTargetsResponse(_message.Message):
    __slots__ = ("advice",)
    ADVICE_FIELD_NUMBER: _ClassVar[int]
    advice: _containers.RepeatedCompositeFieldContainer[TargetAdvice]
    def __init__(self, advice: _Optional[_Iterable[_Union[TargetAdvice, _Mapping]]] = ...) -> None: ...

class TargetAdvice(_message.Message):
    __slots__ = ("tenant", "target", "start_time", "end_time", "successes_by_attempt", "failures_by_attempt", "summary", "recommendation", "proposed_policy", "changes")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    SUCCESSES_BY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FAILURES_BY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDATION_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_POLICY_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    target: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    successes_by_attempt: _containers.RepeatedScalarFieldContainer[int]
    failures_by_attempt: _containers.RepeatedScalarFieldContainer[int]
    summary: str
    recommendation: str
    proposed_policy: _types_pb2.Policy
    changes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., target: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., successes_by_attempt: _Optional[_Iterable[int]] = ..., failures_by_attempt: _Optional[_Iterable[int]] = ..., summary: _Optional[str] = ..., recommendation: _Optional[str] = ..., proposed_policy: _Optional[_Union[_types_pb2.Policy, _Mapping]] = ..., changes: _Optional[_Iterable[str]] = ...) -> None: ...

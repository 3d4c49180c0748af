"""The channel to policyd: one target for one address, a list of replicas
or a DNS name, and the service config that spreads calls over the replicas.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any, Sequence, Union

#: The gRPC service config of the channels the clients dial; give it as the
#: ``grpc.service_config`` channel option to a channel made for
#: ``channel=``. It spreads calls over every replica the target resolves to
#: (round_robin), sends none to a replica whose grpc.health.v1 status is not
#: SERVING (policyd turns NOT_SERVING when it starts to drain), and sends a
#: decision that failed with UNAVAILABLE (its replica died or drained under
#: it) again, to the next replica, within the same decision timeout.
#:
#: Only the RPCs that may run twice are sent again: NextDelay (policyd
#: replays the answer of an attempt it already decided), Classify and
#: PlanBudget (no side effects), Admit, whose second try can at worst hold
#: a HALF_OPEN probe permit that is never settled; permits expire, and no
#: more than N are handed out; ClaimKey, whose second try can at worst find
#: the lease the first one took (IN_FLIGHT, then UNKNOWN once it expires:
#: the call is dead-lettered, never written twice), which is safer than the
#: attempt going on without the idempotency ledger; and CompleteKey, whose
#: second try after a first that was applied is refused
#: (FAILED_PRECONDITION: the client counts the outcome unrecorded).
#: ReportOutcome is not: the client keeps a batch that failed and sends it
#: again itself. WatchBreakers reconnects by itself and starts again from a
#: snapshot. The Go client's ServiceConfig is the same.
SERVICE_CONFIG = json.dumps({
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": ""},
    "methodConfig": [{
        "name": [{"service": "retrypolicy.v1.RetryPolicyService", "method": m}
                 for m in ("NextDelay", "Admit", "Classify", "PlanBudget", "ClaimKey", "CompleteKey")],
        "retryPolicy": {
            "maxAttempts": 4,
            "initialBackoff": "0.005s",
            "maxBackoff": "0.05s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }],
})

#: Address is what the clients dial: ``host:port``, any gRPC target
#: (``dns:///name:port`` for replicas behind one name), or a list of
#: replicas' ``ip:port``.
Address = Union[str, Sequence[str]]


def target(address: Address) -> str:
    """Returns the gRPC target for address: a string as it is, a list of
    replicas as ``ipv4:a,b,...`` (or ``ipv6:``). Raises ValueError naming the
    address for a list that is empty, mixes address families, or holds an
    entry that is not ``ip:port`` (gRPC resolves a list of IP addresses
    only; replicas behind one name are ``dns:///name:port``)."""
    if isinstance(address, str):
        return address
    addrs = list(address)
    if not addrs:
        raise ValueError("policyd_client: address: the list of replicas is empty")
    scheme = ""
    for a in addrs:
        host, sep, port = a.rpartition(":")
        try:
            if not sep or not port.isdigit():
                raise ValueError
            ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
        except ValueError:
            raise ValueError(f"policyd_client: address {a!r}: a list of replicas takes ip:port entries "
                             f"([ip]:port for IPv6); for replicas behind one name give 'dns:///name:port'") from None
        family = f"ipv{ip.version}"
        if scheme and family != scheme:
            raise ValueError(f"policyd_client: address {a!r}: a list of replicas is all IPv4 or all IPv6")
        scheme = family
    return scheme + ":" + ",".join(addrs)


def channel_options() -> list[tuple[str, Any]]:
    """Returns the channel options of the channels the clients dial."""
    return [("grpc.service_config", SERVICE_CONFIG)]

"""The Ray a sweep runs on: ``--address`` checked before Ray is asked (it retries an unreachable address for
minutes), a local Ray started (loopback only, no metrics exporters, no idle workers) or a running cluster
attached, and the trials' resources checked against its nodes (a trial larger than every node would stay
PENDING forever) or, before a local Ray starts, against this machine."""

from __future__ import annotations

import os
from typing import Any

from engine.errors import ConfigError


def check_ray_address(address: str | None, timeout: float = 3.0, answer_timeout: float | None = None) -> None:
    """``--address``: auto, local, or HOST:PORT / ray://HOST:PORT of a running cluster that accepts a connection
    within ``timeout`` seconds and answers as a gRPC server (Ray's GCS and its Ray Client server are) within
    ``answer_timeout`` (``orchestrator.cluster.jobs.ANSWER_TIMEOUT_S`` unless given): Ray itself retries an unreachable address for minutes,
    and one where something listens but never answers forever."""
    import socket
    from urllib.parse import urlsplit

    if address is None or address in ("auto", "local"):
        return
    allowed = "allowed: auto, or a running cluster's HOST:PORT (its GCS, port 6379 by default) or ray://HOST:PORT"
    if "://" in address and not address.startswith("ray://"):
        raise ConfigError.single("--address", address, f"{allowed} (http:// is the dashboard: `fractune submit` "
                                 "takes that)")
    try:
        parts = urlsplit(address if "://" in address else "ray://" + address)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigError.single("--address", address, f"malformed ({exc}); {allowed}") from None
    if not host or not port:
        raise ConfigError.single("--address", address, allowed)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except UnicodeError as exc:  # a host name that cannot be encoded (IDNA): too long a label, a control character
        raise ConfigError.single("--address", address, f"not a valid host name ({exc}); {allowed}") from None
    except OSError as exc:
        raise ConfigError.single("--address", address, f"no Ray cluster reachable there within {timeout:g} s "
                                 f"({exc.strerror or exc}); start it (ray start --head) or give auto") from None
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return  # a TLS cluster's handshake needs its certificates; Ray checks those itself
    import grpc

    from orchestrator.cluster import jobs

    answer_timeout = jobs.ANSWER_TIMEOUT_S if answer_timeout is None else answer_timeout
    channel = grpc.insecure_channel(f"{host}:{port}")
    silent = (f"something listens there but does not answer as a Ray cluster within {answer_timeout:g} s; "
              f"{allowed}")
    try:
        grpc.channel_ready_future(channel).result(timeout=answer_timeout)
        _ask_as_ray(channel, address.startswith("ray://"), answer_timeout)
    except grpc.FutureTimeoutError:
        raise ConfigError.single("--address", address, silent) from None
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise ConfigError.single("--address", address, silent) from None
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:  # another gRPC or HTTP/2 service: Ray would retry it
            raise ConfigError.single("--address", address, f"a gRPC service there, but not a Ray cluster's (it "
                                     f"does not know Ray's calls); {allowed}") from None
        # anything else (a token cluster refusing a call without its token, say) is Ray answering
    finally:
        channel.close()


def _ask_as_ray(channel, client: bool, timeout: float) -> None:
    """One call of Ray's own to the address: the GCS's cluster id, or a Ray Client server's ping."""
    if client:
        from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

        ping = ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING)
        ray_client_pb2_grpc.RayletDriverStub(channel).ClusterInfo(ping, timeout=timeout)
    else:
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(gcs_service_pb2.GetClusterIdRequest(),
                                                                         timeout=timeout)


RAY_SYSTEM_CONFIG = {"enable_metrics_collection": False, "enable_worker_prestart": False,
                     "prestart_worker_first_driver": False}


def attaches(address: str | None) -> bool:
    """Whether ``init_ray`` attaches to a running cluster (``--address``, or the ``RAY_ADDRESS`` a Ray job's driver
    is given) rather than starting a local Ray on this machine."""
    return bool(address or os.environ.get("RAY_ADDRESS"))


def init_ray(address: str | None, dashboard: bool = False) -> None:
    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": True, "logging_level": "ERROR"}
    try:
        if attaches(address):
            # never CPU/GPU counts or a _system_config: those belong to whoever started the cluster
            ray.init(**({"address": address} if address else {}), **kwargs)
        else:
            # The dashboard (HTTP, Jobs API) binds 127.0.0.1; Ray's gRPC ports are guarded by its token auth.
            # Metrics collection is off: its Prometheus endpoint would listen on every interface, unauthenticated.
            # The node's address is loopback: Ray's autoscaler and dashboard metrics servers (fixed ports 44217
            # and 44227, plain HTTP, no auth) bind every interface unless the node itself is on localhost, and
            # Ray turns a 127.0.0.1 node address into the machine's address unless "clusters" are disabled (its
            # macOS/Windows mode: this process's constant, and the environment its processes start with).
            # No idle workers are started ahead: a sweep's trials are actors, which get processes of their own,
            # so prestarted workers would only import Ray and exit unused.
            from ray._private import ray_constants

            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            ray_constants.ENABLE_RAY_CLUSTER = False
            ray.init(include_dashboard=dashboard, dashboard_host="127.0.0.1", _node_ip_address="127.0.0.1",
                     _system_config=RAY_SYSTEM_CONFIG, **kwargs)
    except Exception as exc:  # ConnectionError, RuntimeError, ValueError from Ray: one line, the cause
        from results.store import one_line_error

        raise ConfigError.single("--address", address or "(local)", f"Ray could not start or attach "
                                 f"({one_line_error(exc)[:300]})") from None


def check_resources(cpu: float, gpu: float, workers: int = 1) -> None:
    """Refuse a sweep whose trials fit on no node, or whose workers (``cpu`` and ``gpu`` each) do not fit in the
    cluster together (Tune or Ray Train would wait for them forever)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    best_cpu = max((n["Resources"].get("CPU", 0.0) for n in nodes), default=0.0)
    best_gpu = max((n["Resources"].get("GPU", 0.0) for n in nodes), default=0.0)
    problems = []
    slots = sum(worker_slots(n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0), cpu, gpu) for n in nodes)
    if workers > 1 and workers > slots:
        problems.append(("resources.workers", workers, f"allowed: <= {slots:g} (workers of cpu {cpu:g}, gpu "
                         f"{gpu:g} that this cluster's nodes hold together)"))
    if cpu > best_cpu:
        problems.append(("resources.cpu", cpu, f"allowed: <= {best_cpu:g} (CPUs of the largest node of this cluster)"))
    if gpu > best_gpu:
        problems.append(("resources.gpu", gpu, f"allowed: <= {best_gpu:g} (GPUs of the largest node of this cluster)"))
    if problems:
        raise ConfigError(problems)


def worker_slots(node_cpus: float, node_gpus: float, cpu: float, gpu: float) -> float:
    """How many workers of ``cpu`` CPUs and ``gpu`` GPUs each one node holds."""
    return min(node_cpus // cpu, node_gpus // gpu if gpu else float("inf"))


def local_cpus() -> int:
    """The CPUs this process may use: what a local Ray started here gets."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def local_gpus() -> int:
    """The GPUs torch sees here: what a local Ray started here gets (imports torch: call it only where GPUs may be
    used)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_local_resources(cpu: float, gpu: float, workers: int = 1) -> None:
    """``check_resources`` against the local Ray that would start here (this process's CPUs, the GPUs torch
    sees), without starting it; the check on the started Ray follows."""
    cpus = local_cpus()
    gpus = local_gpus() if gpu > 0 else 0  # torch only where GPUs are asked for: a CPU sweep's driver never imports it
    problems = []
    if cpu > cpus:
        problems.append(("resources.cpu", cpu, f"allowed: <= {cpus:g} (CPUs of this machine, where a local Ray "
                         "would start)"))
    if gpu > gpus:
        problems.append(("resources.gpu", gpu, f"allowed: <= {gpus:g} (GPUs of this machine, where a local Ray "
                         "would start)"))
    slots = worker_slots(cpus, gpus, cpu, gpu)
    if workers > 1 and workers > slots and not problems:
        problems.append(("resources.workers", workers, f"allowed: <= {slots:g} (workers of cpu {cpu:g}, gpu {gpu:g} "
                         "on this machine, where a local Ray would start)"))
    if problems:
        raise ConfigError(problems)

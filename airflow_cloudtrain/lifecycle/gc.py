"""``cloudtrain gc``: find what the provider left on a cloud, and delete what no run wants any more.

Every resource a run creates carries its run key (a tag, a label, or a name ``ct-<digest>...``). The
cloud modules register a lister per ledger kind (``core.inventory``); ``find_leftovers`` calls them
all, finds each resource's run folder (its ``TAG_RUN_URI``, a sibling resource's of the same run key,
or the ``spec.json`` under ``--bucket`` whose run id matches) and reads the run's state there:

    live      ``lease.json`` fresh: a watcher still wants the run. Never touched.
    lapsed    ``orphaned.json`` written, or ``lease.json`` not renewed for ``orphan_timeout``.
    finished  every instance's ``status.json`` is final (a resume run: its loop ledgers are ended), or
              the run folder no longer exists.
    unknown   no lease (a release without leases, or no run folder to read): decided by age alone.

A resource goes when its run is lapsed, finished or unknown AND it is older than ``older_than``
(default 1 h: a run being launched right now, whose lease is not written yet, is never touched). A
Vertex AI job has no agent of ours: ``gc`` is what cancels one whose lease lapsed.

With a bucket, the bucket's running index entries that no attempt stands behind any more are listed
too (kind ``running_index``, ``lifecycle.gc_running``) and deleted under the same rule.

``sweep`` deletes through the ledger kinds' own deleters (``ResourceLedger.release`` per run: groups
first, firewall rules and gang networks last) and records ``orphaned.json`` (ended by ``gc``) for a run
it ended because its lease lapsed. ``dry_run`` makes no write call at all.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from airflow_cloudtrain.clouds.gcp.vertex import KIND as VERTEX_KIND
from airflow_cloudtrain.contract.lease import LEASE_KEY, ORPHANED_KEY, Lease, Orphaned
from airflow_cloudtrain.contract.runs import FINAL_STATES, SPEC_KEY
from airflow_cloudtrain.core.inventory import Tagged, listers
from airflow_cloudtrain.core.ledger import Resource, ResourceLedger
from airflow_cloudtrain.core.retry import call_with_retry
from airflow_cloudtrain.lifecycle import gc_running
from airflow_cloudtrain.lifecycle.leftovers import (
    DELETE,
    FINISHED,
    KEEP,
    LAPSED,
    LIVE,
    UNKNOWN,
    Leftover,
    RunView,
    Source,
    decide,
    fmt_duration,
)

if TYPE_CHECKING:
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.ledger import LedgerBackend
    from airflow_cloudtrain.storage import RunFolder

log = logging.getLogger(__name__)

DEFAULT_OLDER_THAN_S = 3600.0
COLUMNS = ("kind", "id", "location", "run key", "age", "state", "$/h", "lease", "action")
_STATUS = re.compile(r"^instances/([^/]+)/status\.json$")
_LOOP_LEDGER = re.compile(r"^ledger/[^/]+\.json$")  # a CheckpointResumeOperator loop's ledger
_LOOP_ENDED = frozenset({"succeeded", "failed"})


def run_view(folder: RunFolder, now: float) -> RunView:
    """The run's lease state from its run folder (see the module docstring)."""
    keys = folder.list("")
    if not keys:
        return RunView(FINISHED, "run folder gone")
    lease = None
    if LEASE_KEY in keys:
        try:
            lease = Lease.from_json(folder.get_text(LEASE_KEY) or "")
        except ValueError:
            lease = None  # a torn write: the next renewal fixes it; treat as no lease
    fresh = lease is not None and lease.orphan_timeout_s is not None and not lease.lapsed(now)
    if ORPHANED_KEY in keys:
        noticed = _orphaned_at(folder)
        # a retry renewing the lease after the run was orphaned is a new, watched run
        if not (fresh and lease is not None and noticed is not None and lease.renewed_at > noticed):
            return RunView(LAPSED, "orphaned.json written")
    if fresh and lease is not None:
        return RunView(LIVE, f"lease renewed {fmt_duration(now - lease.renewed_at)} ago")
    if _finished(folder, keys):
        return RunView(FINISHED, "run finished")
    if lease is not None and lease.lapsed(now):
        return RunView(
            LAPSED, f"lease lapsed {fmt_duration(now - (lease.lapses_at() or now))} ago", lease.lapses_at()
        )
    return RunView(UNKNOWN, "no lease" if lease is None else "lease without orphan_timeout")


def _orphaned_at(folder: RunFolder) -> float | None:
    """When whoever ended the orphaned run noticed it (None: unreadable)."""
    try:
        return Orphaned.from_json(folder.get_text(ORPHANED_KEY) or "").noticed_at
    except ValueError:
        return None


def _finished(folder: RunFolder, keys: list[str]) -> bool:
    """Every loop ledger ended (a resume run), else every instance's status final (at least one)."""
    loops = [k for k in keys if _LOOP_LEDGER.match(k)]
    if loops:
        states = [str(json.loads(folder.get_text(k) or "{}").get("state", "running")) for k in loops]
        return all(s in _LOOP_ENDED for s in states)
    statuses = [k for k in keys if _STATUS.match(k)]
    if not statuses:
        return False
    for key in statuses:
        try:
            state = json.loads(folder.get_text(key) or "{}").get("state")
        except ValueError:
            return False
        if state not in FINAL_STATES:
            return False
    return True


# --- where the resources are -------------------------------------------------------------------------


def sources(
    cloud: str,
    region: str | None = None,
    zone: str | None = None,
    project_id: str | None = None,
    aws_conn_id: str | None = "aws_default",
    gcp_conn_id: str = "google_cloud_default",
) -> list[Source]:
    """The backends of ``cloud`` (``aws``/``ec2``/``ec2spot`` or ``gcp``/``gcloud``/``gcspot``) in one
    region (or a GCE zone's region); importing the provider's modules registers every kind's lister."""
    from airflow_cloudtrain.clouds.registry import backend_for

    provider = provider_name(cloud)
    if provider == "aws":
        import airflow_cloudtrain.clouds.aws.fleet  # noqa: F401  (registers the fleet's kinds and listers)

        aws = backend_for("ec2", region=region, aws_conn_id=aws_conn_id)
        return [Source("aws", aws, aws)]
    import airflow_cloudtrain.clouds.gcp.fleet  # noqa: F401
    from airflow_cloudtrain.clouds.gcp.vertex import VertexJobs
    from airflow_cloudtrain.hooks.vertex import VertexHook

    region = region or (zone.rsplit("-", 1)[0] if zone else None)
    gcp = backend_for("gcloud", region=region, gcp_conn_id=gcp_conn_id, project_id=project_id)
    if not gcp.region:
        raise ValueError("cloudtrain gc on GCP needs --region or --zone (or a region in the connection)")
    hook = VertexHook(gcp_conn_id=gcp_conn_id, project_id=project_id)
    vertex = VertexJobs(hook.job_client(gcp.region), hook.project, gcp.region)
    return [Source("gcp", gcp, gcp), Source("vertex", vertex, gcp)]


def provider_name(cloud: str) -> str:
    """``aws`` for aws/ec2/ec2spot, ``gcp`` for gcp/gce/gcloud/gcspot; ValueError for anything else."""
    name = (cloud or "").lower()
    if name in ("aws", "ec2", "ec2spot"):
        return "aws"
    if name in ("gcp", "gce", "gcloud", "gcspot"):
        return "gcp"
    raise ValueError(f"cloud={cloud!r} is not valid: use aws (ec2, ec2spot) or gcp (gcloud, gcspot)")


# --- listing -----------------------------------------------------------------------------------------


def find_leftovers(
    cloud: str,
    region: str | None = None,
    zone: str | None = None,
    project_id: str | None = None,
    bucket: str | None = None,
    older_than_s: float = DEFAULT_OLDER_THAN_S,
    *,
    aws_conn_id: str | None = "aws_default",
    gcp_conn_id: str = "google_cloud_default",
    now: float | None = None,
) -> list[Leftover]:
    """Every resource carrying the provider's run tags in that region (zone), with the decision."""
    return classify(
        sources(cloud, region, zone, project_id, aws_conn_id, gcp_conn_id), bucket, older_than_s, zone, now
    )


def classify(
    found_in: list[Source],
    bucket: str | None,
    older_than_s: float,
    zone: str | None = None,
    now: float | None = None,
) -> list[Leftover]:
    now = time.time() if now is None else now
    tagged: list[tuple[Source, Tagged]] = []
    for source in found_in:
        for kind, lister in sorted(listers(source.key).items()):
            try:  # a listing is safe to repeat: throttling and 5xx are waited out, as every call's
                items = call_with_retry(functools.partial(lister, source.backend))
            except Exception as err:
                raise RuntimeError(f"listing {kind} resources failed: {err}") from err
            tagged += [(source, t) for t in items if not _other_zone(t.location, zone)]
    uris: dict[str, str] = {}
    oldest: dict[str, float] = {}
    for _, t in tagged:
        if t.digest and t.run_uri:
            uris.setdefault(t.digest, t.run_uri)
        if t.digest and t.created_at is not None:
            oldest[t.digest] = min(oldest.get(t.digest, t.created_at), t.created_at)
    missing = {t.digest for _, t in tagged if t.digest and t.digest not in uris}
    if missing and bucket and found_in:
        uris.update(_uris_in_bucket(found_in[0].folders, bucket, missing))
    views: dict[str, RunView] = {}
    out = []
    for source, t in tagged:
        uri = t.run_uri or (uris.get(t.digest) if t.digest else None)
        if uri is not None and uri not in views:
            views[uri] = run_view(_folder(source.folders, uri), now)
        view = views[uri] if uri is not None else RunView(UNKNOWN, "no run folder known")
        created = t.created_at if t.created_at is not None else oldest.get(t.digest or "")
        age = None if created is None else max(0.0, now - created)
        action, why = decide(view.lease, age, older_than_s, has_run=uri is not None)
        if t.kind == VERTEX_KIND and action == DELETE and view.lease != LAPSED:
            # only active jobs are listed; an empty job folder is no sign that the job is over
            action, why = KEEP, "a Vertex AI job is cancelled only when its lease lapsed"
        if action == DELETE and view.lease in (FINISHED, LAPSED) and view.why != why:
            why = view.why if view.why.startswith(why) else f"{why} ({view.why})"
        out.append(
            Leftover(
                t.kind,
                t.id,
                t.location,
                t.digest,
                uri,
                age,
                t.state,
                t.hourly_usd,
                view.lease,
                action,
                why,
                source=source,
                view=view,
            )
        )
    if bucket and found_in:  # the bucket's running index entries that stand for no attempt any more
        for entry in gc_running.stale_entries(_folder(found_in[0].folders, bucket), older_than_s, now):
            entry.source = found_in[0]
            out.append(entry)
    return sorted(out, key=lambda x: (x.digest or "", x.kind, x.id))


def _other_zone(location: str | None, zone: str | None) -> bool:
    """With ``--zone``: a zonal resource (a VM, a group) of another zone is not listed."""
    return bool(zone and location and re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", location) and location != zone)


def _folder(backend: RunBackend, uri: str) -> RunFolder:
    """The run folder through the backend's clients when the bucket is its cloud's, else defaults."""
    scheme = uri.split("://", 1)[0]
    if {"s3": "aws", "gs": "gcp"}.get(scheme) == backend.provider:
        return backend.run_folder(uri)
    from airflow_cloudtrain.storage import open_run_folder

    return open_run_folder(uri)


def _uris_in_bucket(backend: RunBackend, bucket: str, digests: set[str]) -> dict[str, str]:
    """Run folders under ``bucket`` whose ``spec.json`` names one of these runs (run id
    ``ct-<digest[:12]>``): for resources that carry only the run key (queues, groups, secrets)."""
    from airflow_cloudtrain.contract.runs import RunSpec, join

    by_short = {f"ct-{d[:12]}": d for d in digests}
    root = _folder(backend, bucket)
    out: dict[str, str] = {}
    for key in root.list("runs/"):
        if not key.endswith(f"/{SPEC_KEY}") or key.count("/") != 5:  # runs/dag/task/run/index/spec.json
            continue
        try:
            spec = RunSpec.from_json(root.get_text(key) or "")
        except (ValueError, TypeError):
            continue
        if spec.run_id in by_short:
            out[by_short[spec.run_id]] = spec.run_uri or join(bucket, key.rsplit("/", 1)[0])
    return out


def gc(
    cloud: str,
    region: str | None = None,
    zone: str | None = None,
    project_id: str | None = None,
    bucket: str | None = None,
    dry_run: bool = False,
    older_than_s: float = DEFAULT_OLDER_THAN_S,
    aws_conn_id: str | None = "aws_default",
    gcp_conn_id: str = "google_cloud_default",
) -> list[Leftover]:
    """List, then (without ``dry_run``) sweep: what the CLI and ``CloudTrainGcOperator`` both run."""
    found = find_leftovers(
        cloud,
        region,
        zone,
        project_id,
        bucket,
        older_than_s,
        aws_conn_id=aws_conn_id,
        gcp_conn_id=gcp_conn_id,
    )
    sweep(found, dry_run=dry_run)
    return found


def format_table(found: list[Leftover]) -> str:
    """The listing: one row per resource, the action last (``delete: why`` / ``keep: why``)."""
    if not found:
        return "no resource of cloudtrain found"
    rows = [
        (
            x.kind,
            x.id,
            x.location or "-",
            (x.digest or "?")[:12],
            "?" if x.age_s is None else fmt_duration(x.age_s),
            x.state or "-",
            "-" if x.hourly_usd is None else f"{x.hourly_usd:.4f}",
            x.lease,
            f"{x.action}: {x.why}",
        )
        for x in found
    ]
    widths = [max(len(str(r[i])) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    header = "  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)).rstrip()
    return "\n".join([header, *lines])


# --- deleting ----------------------------------------------------------------------------------------


def sweep(leftovers: list[Leftover], dry_run: bool = False, now: float | None = None) -> list[Leftover]:
    """Delete the leftovers marked ``delete``, run by run, through their kinds' deleters (in the
    kinds' release order); returns them with ``result`` set. ``dry_run``: nothing is called."""

    doomed = [x for x in leftovers if x.action == DELETE]
    if dry_run:
        return doomed
    now = time.time() if now is None else now
    runs: dict[tuple[int, str], list[Leftover]] = defaultdict(list)
    index_entries: dict[str, list[Leftover]] = defaultdict(list)
    for x in doomed:
        if x.kind == gc_running.KIND:  # an object in the bucket, not a cloud resource of a ledger kind
            index_entries[x.location or ""].append(x)
        else:
            runs[(id(x.source), x.digest or "")].append(x)
    for bucket, group in index_entries.items():
        assert group[0].source is not None
        gc_running.delete_entries(_folder(group[0].source.folders, bucket), group)
    for (_, digest), group in runs.items():
        group.sort(key=lambda x: -(x.age_s or 0.0))  # oldest first: the ledger releases newest first
        entries = [Resource(x.kind, x.id, x.location) for x in group]
        ledger = ResourceLedger(digest or "unknown", None, entries, log)
        source = group[0].source
        assert source is not None
        backend: LedgerBackend = source.backend
        try:
            ledger.release(backend, sweep=False)
        except Exception as err:
            left = {(e.kind, e.id) for e in ledger.entries}
            for x in group:
                x.result = f"failed: {err}" if (x.kind, x.id) in left else "deleted"
        else:
            for x in group:
                x.result = "deleted"
    _record_orphans([x for x in doomed if x.result == "deleted"], now)
    return doomed


def _record_orphans(deleted: list[Leftover], now: float) -> None:
    """``orphaned.json`` (ended by ``gc``) in each run folder whose lease lapsed and that gc ended:
    what ``cloudtrain runs`` shows. Best effort: the resources are gone either way."""
    done: set[str] = set()
    for x in deleted:
        if (
            x.run_uri is None
            or x.run_uri in done
            or x.source is None
            or x.view is None
            or x.view.lapsed_at is None
        ):
            continue
        done.add(x.run_uri)
        try:
            folder = _folder(x.source.folders, x.run_uri)
            if folder.get_text(ORPHANED_KEY) is None:
                folder.put_text(ORPHANED_KEY, Orphaned(x.view.lapsed_at, "gc", now).to_json())
        except Exception as err:
            log.warning("Could not record %s in %s: %s", ORPHANED_KEY, x.run_uri, err)

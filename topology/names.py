"""Syntax checks for names that reach Kubernetes, S3, AWS, Modal and Prometheus, applied at input time.

Each check returns the value or raises ValueError saying what is allowed (pydantic turns it into a
one-line error naming the field). The rules, as documented upstream:
- Kubernetes label values: at most 63 characters, empty or [A-Za-z0-9] at both ends with [-_.A-Za-z0-9]
  between (kubernetes.io "Labels and Selectors"; apimachinery validation.IsValidLabelValue);
- DNS-1123 labels: at most 63 characters of [a-z0-9-], alphanumeric at both ends; DNS-1123 subdomains:
  at most 253 characters, dot-separated labels (kubernetes.io "Object Names and IDs");
- label keys: an optional DNS-1123 subdomain prefix and '/', then a name part of at most 63 characters
  with the label-value syntax (non-empty);
- S3 general purpose bucket names: 3–63 characters of [a-z0-9.-], alphanumeric at both ends, no '..',
  not an IP address, not starting 'xn--', 'sthree-' or 'amzn-s3-demo-', not ending '-s3alias',
  '--ol-s3', '.mrap' or '--x-s3' (AWS S3 User Guide, "General purpose bucket naming rules");
- AWS regions: e.g. us-east-1, eu-central-2, us-gov-west-1, cn-north-1, ap-southeast-7;
- timezones: a key of the IANA database as installed (zoneinfo.available_timezones: data, not the clock).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import re
import zoneinfo

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
AWS_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]{1,2}$")
MODAL_REGION = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
MODEL_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
MODEL_NAME_MAX = 128


def check_label_value(v: str) -> str:
    if len(v) > 63 or not LABEL_VALUE.fullmatch(v):
        raise ValueError(
            f"{v[:80]!r} is not a Kubernetes label value: at most 63 characters, letters, digits, '-', '_', '.', "
            "starting and ending with a letter or digit"
        )
    return v


def check_revision(v: str) -> str:
    """A weights revision: a pod label value, and a segment of an S3 prefix (so no '..')."""
    check_label_value(v)
    if ".." in v:
        raise ValueError(f"{v[:80]!r} is not a revision: '..' is not allowed (it becomes part of an S3 prefix)")
    return v


def check_label_key(k: str) -> str:
    prefix, slash, name = k.rpartition("/")
    ok = bool(name) and len(name) <= 63 and LABEL_VALUE.fullmatch(name) is not None
    if slash:
        ok = ok and len(prefix) <= 253 and DNS1123_SUBDOMAIN.fullmatch(prefix) is not None
    if not ok:
        raise ValueError(
            f"{k[:80]!r} is not a Kubernetes label key: [prefix/]name, the name at most 63 characters of letters, "
            "digits, '-', '_', '.' (alphanumeric at both ends), the prefix a DNS subdomain"
        )
    return k


def check_dns_label(v: str) -> str:
    if len(v) > 63 or not DNS1123_LABEL.fullmatch(v):
        raise ValueError(f"{v[:80]!r} is not a DNS-1123 label: at most 63 of a-z, 0-9, '-', alphanumeric at both ends")
    return v


def check_dns_subdomain(v: str) -> str:
    if len(v) > 253 or not DNS1123_SUBDOMAIN.fullmatch(v):
        raise ValueError(
            f"{v[:80]!r} is not a DNS-1123 subdomain: at most 253 of a-z, 0-9, '-', '.', alphanumeric at both ends"
        )
    return v


def check_bucket_name(v: str) -> str:
    bad = (
        not BUCKET.fullmatch(v) or ".." in v or IPV4.fullmatch(v)
        or v.startswith(("xn--", "sthree-", "amzn-s3-demo-"))
        or v.endswith(("-s3alias", "--ol-s3", ".mrap", "--x-s3"))
    )
    if bad:
        raise ValueError(
            f"{v[:80]!r} is not an S3 bucket name: 3–63 of a-z, 0-9, '.', '-', starting and ending with a letter "
            "or digit, no '..', not an IP address, no reserved prefix (xn--, sthree-) or suffix (-s3alias, --ol-s3)"
        )
    return v


def check_aws_region(v: str) -> str:
    if not AWS_REGION.fullmatch(v):
        raise ValueError(f"{v[:80]!r} is not an AWS region name, e.g. 'us-east-1', 'eu-central-2', 'us-gov-west-1'")
    return v


# Modal's price multiplier for a pinned region, on GPU, CPU and memory alike (modal.com/docs/guide/region-selection,
# as stored 2026: "Broad (e.g. `us`) 1.5x, Narrow (e.g. `us-west`) 1.75x"): a broad region is one word
MODAL_BROAD_MULTIPLIER = 1.5
MODAL_NARROW_MULTIPLIER = 1.75


def modal_region_multiplier(region: str) -> float:
    return MODAL_BROAD_MULTIPLIER if "-" not in region else MODAL_NARROW_MULTIPLIER


def check_modal_region(v: str) -> str:
    if len(v) > 40 or not MODAL_REGION.fullmatch(v):
        raise ValueError(f"{v[:80]!r} is not a Modal region, e.g. 'us-east', 'us', 'eu-west' (lowercase, '-' separated)")
    return v


def check_model_name(v: str) -> str:
    """A served model name: one or two '/'-separated parts of letters, digits, '.', '_', '-' (an S3 prefix, a
    vLLM --served-model-name and a PromQL label value: no quotes, spaces, control characters or '..')."""
    parts = v.split("/")
    if len(v) > MODEL_NAME_MAX or len(parts) > 2 or ".." in v or not all(MODEL_NAME_PART.fullmatch(p) for p in parts):
        raise ValueError(
            f"{v[:80]!r} is not a model name: at most {MODEL_NAME_MAX} characters, letters, digits, '.', '_', '-' "
            "(optionally 'org/name'), starting with a letter or digit, no '..'"
        )
    return v


@functools.lru_cache(maxsize=1)
def _timezones() -> frozenset[str]:
    # 'localtime' (Debian's link to this machine's zone) and 'Factory' are in the tz database's files but name no
    # place: a profile in 'localtime' would shift with the machine that plans it, and Modal's and KEDA's cron refuse it
    return frozenset(zoneinfo.available_timezones()) - {"localtime", "Factory", "posixrules"}


def check_timezone(v: str) -> str:
    zones = _timezones()
    if v not in zones:
        close = difflib.get_close_matches(v, sorted(zones), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"{v[:80]!r} is not an IANA timezone (e.g. 'UTC', 'America/New_York', 'Europe/Berlin'){hint}")
    return v


# How the deploy spells an endpoint's and a tenant's names where the gateway and dashboards fold them. The
# inputs check with these rules that names written apart stay apart once folded, and the components spell what
# they deploy with the same functions, so the check and the deploy cannot drift.
MODAL_NAME_MAX = 64  # Modal object and environment names (modal 1.6.4 _utils/name_utils.py: is_valid_object_name)
GRAFANA_UID_MAX = 40  # Grafana's dashboard uid limit (Dashboard HTTP API docs: "a maximum length of 40 characters")


def config_name(name: str) -> str:
    """A name as HAProxy section names, variables and stick-table keys spell it: lower case, runs of anything but
    a-z and 0-9 as one '_'. Folds 'Acme' and 'acme', and 'a-b' and 'a--b', together."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def env_name(endpoint: str, secret_key: str) -> str:
    """The gateway pod's environment variable carrying one endpoint's secret key (every endpoint's variables
    share the pod: two pairs that fold alike would read one secret)."""
    return "GW_" + re.sub(r"[^A-Z0-9]+", "_", f"{endpoint}_{secret_key}".upper()).strip("_")


def tenant_api_key_secret_key(tenant: str) -> str:
    """The key in the endpoint's tenants Secret holding this tenant's API key."""
    return f"{tenant}-api-key"


def tenant_cache_salt_secret_key(tenant: str) -> str:
    """The key in the endpoint's tenants Secret holding this tenant's cache_salt (endpoints with > 1 tenant)."""
    return f"{tenant}-cache-salt"


def tenant_env_names(endpoint: str, tenant: str, multi_tenant: bool) -> list[str]:
    """Every environment variable the gateway pod reads for this tenant of this endpoint."""
    names = [env_name(endpoint, tenant_api_key_secret_key(tenant))]
    if multi_tenant:
        names.append(env_name(endpoint, tenant_cache_salt_secret_key(tenant)))
    return names


def dashboard_uid(namespace: str, endpoint: str) -> str:
    """The endpoint's Grafana dashboard uid: `<namespace>-<name>` (the bundled stacks' namespace llm-serving gives
    the uids they always had) when that fits Grafana's 40 characters, otherwise cut with a digest of both names
    appended. Two long names sharing a prefix, or one endpoint name in two stacks' namespaces under one Grafana,
    keep apart (a plain cut, or no namespace, made one dashboard overwrite the other)."""
    uid = f"{namespace}-{config_name(endpoint)}"
    if len(uid) <= GRAFANA_UID_MAX:
        return uid
    digest = hashlib.sha256(f"{namespace}/{endpoint}".encode()).hexdigest()[:8]
    return f"{uid[:GRAFANA_UID_MAX - 9]}-{digest}"


def dashboard_file_name(namespace: str, endpoint: str) -> str:
    """The dashboard's file in the Grafana sidecar's folder, which holds every watched namespace's dashboards."""
    return f"{namespace}-{config_name(endpoint)}.json"


# The pod label every floor pod (stable, canary, previous) carries with its endpoint's name. The floor PodMonitor
# copies it onto the pods' series (podTargetLabels), so the queries that drive one endpoint's autoscaling, alerts,
# dashboards and calibration select its pods by endpoint: vLLM labels its series by served model name, which two
# endpoints of one stack may share.
ENDPOINT_LABEL = "serving.llm/endpoint"


def prometheus_label_name(pod_label: str) -> str:
    """The Prometheus label a PodMonitor's `podTargetLabels` entry becomes: prometheus-operator writes
    `target_label: sanitizeLabelName(l)` (pkg/prometheus/promcfg.go), which replaces every character outside
    [a-zA-Z0-9_] by '_' (`serving.llm/endpoint` -> `serving_llm_endpoint`)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


ENDPOINT_METRIC_LABEL = prometheus_label_name(ENDPOINT_LABEL)
TRACK_LABEL = "serving.llm/track"  # pod label: the revision track a pod serves (TRACK_STABLE or a candidate's)
TRACK_METRIC_LABEL = prometheus_label_name(TRACK_LABEL)  # copied with the endpoint's (podTargetLabels)
TRACK_STABLE = "stable"


def promql_escape(value: str) -> str:
    """`value` as the contents of a PromQL double-quoted string (backslash, quote and line breaks escaped: PromQL
    unquotes strings as Go does, so a regex's `\\-` must arrive as `\\\\-`). The names that reach label matchers
    are checked at input time to need none of this; it keeps a matcher a matcher whatever reaches it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal holding `value`."""
    return f'"{promql_escape(value)}"'


def burst_volume_name(project: str, environment: str, endpoint: str, revision: str) -> str:
    """The Modal Volume holding one weights revision for an endpoint's burst app: `<project>-<environment>-
    <endpoint>-w<4 hex of the revision>`. One volume per revision, so a promotion (or a rollback) fills the new
    revision's volume while the running app still serves from the old one, then deploys onto it; under one name per
    endpoint the fill met the old revision's marker and refused (a failed `pulumi up`), and forcing it would have
    overwritten the weights under the containers serving. As long as the app's name (`-w` + 4 against `-burst`),
    so every name the app-name check admits fits Modal's MODAL_NAME_MAX; two revisions of one endpoint whose
    digests collide (1 in 65,536) share a volume, and its revision marker refuses the second fill by name."""
    digest = hashlib.sha256(revision.encode()).hexdigest()[:4]
    return f"{project}-{environment}-{endpoint}-w{digest}"


def burst_app_name(project: str, environment: str, endpoint: str) -> str:
    """The endpoint's Modal burst app: at most MODAL_NAME_MAX characters of [a-zA-Z0-9-_.] (checked in the
    inputs, which are already lower case, digits and '-')."""
    return f"{project}-{environment}-{endpoint}-burst"

"""The AWS templates (deploy/aws/) against the code they deploy, with no AWS call: the index key
schema is the one the code creates, the load balancer routes the three prefixes to the right
services, every IAM action is one the code calls (found by scanning the storage adapters' boto3
calls) on the stack's own resources, every role can do what its code does, every setting the
templates set is one the code reads, and the cost model adds up and prices the defaults.

cfn-lint runs over every template in tests/deploy/test_static.py.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import boto3
import pytest
import yaml
from botocore.exceptions import ClientError

ROOT = Path(__file__).resolve().parents[2]
AWS = ROOT / "deploy" / "aws"
STORAGE_CODE = ROOT / "ndstore" / "storage"
TEMPLATES = ("storage.yaml", "ingest.yaml", "service.yaml")


# --- loading templates ----------------------------------------------------------------------------

def _loader() -> type[yaml.SafeLoader]:
    """YAML with CloudFormation's short tags turned into their long JSON form."""

    class Loader(yaml.SafeLoader):  # type: ignore[misc]
        pass

    def construct(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        value: Any
        if isinstance(node, yaml.ScalarNode):
            value = loader.construct_scalar(node)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)
        if suffix == "Ref":
            return {"Ref": value}
        if suffix == "GetAtt" and isinstance(value, str):
            value = value.split(".", 1)
        return {f"Fn::{suffix}": value}

    Loader.add_multi_constructor("!", construct)
    return Loader


@cache
def template(name: str) -> dict[str, Any]:
    return yaml.load((AWS / name).read_text(), Loader=_loader())  # type: ignore[no-any-return]  # noqa: S506


def resources(name: str, kind: str) -> dict[str, dict[str, Any]]:
    return {lid: r for lid, r in template(name)["Resources"].items() if r["Type"] == kind}


def default(name: str, value: Any) -> Any:
    """A literal, or the default of the parameter it refers to."""
    if isinstance(value, dict) and "Ref" in value:
        return template(name)["Parameters"][value["Ref"]]["Default"]
    return value


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def handler_of(function: dict[str, Any]) -> str:
    """A SAM function's handler: Handler, or a container image's command."""
    props = function["Properties"]
    return str(props["ImageConfig"]["Command"][0] if props.get("PackageType") == "Image" else props["Handler"])


# --- what the code calls: a scan of the storage adapters' boto3 calls ---------------------------

# IAM actions of the API operations whose action has another name (AWS's Service Authorization
# Reference); every other operation Op of service s is the action s:Op.
ACTION_OF_OPERATION = {
    ("s3", "HeadBucket"): "s3:ListBucket",
    ("s3", "ListObjectsV2"): "s3:ListBucket",
    ("s3", "HeadObject"): "s3:GetObject",
    ("s3", "DeleteObjects"): "s3:DeleteObject",
    # a multipart upload is authorised as the PUT it makes; only its abort has an action of its own
    ("s3", "CreateMultipartUpload"): "s3:PutObject",
    ("s3", "UploadPart"): "s3:PutObject",
    ("s3", "CompleteMultipartUpload"): "s3:PutObject",
    ("s3", "PutBucketNotificationConfiguration"): "s3:PutBucketNotification",
    ("sqs", "SendMessageBatch"): "sqs:SendMessage",
    ("sqs", "DeleteMessageBatch"): "sqs:DeleteMessage",
    ("sqs", "ChangeMessageVisibilityBatch"): "sqs:ChangeMessageVisibility",
    # authorised per item; the code's transactions hold Update items only (checked below)
    ("dynamodb", "TransactWriteItems"): "dynamodb:UpdateItem",
}
# Created by the code only when missing (ensure_ready); the stacks create them, so no role needs them.
CREATE_IF_MISSING = {"s3:CreateBucket", "dynamodb:CreateTable"}
# Called by the ECS agent with a task's execution role, not by our code: pull the image, write
# the task's logs, read its secrets.
EXECUTION_ROLE_ACTIONS = {"ecr:GetAuthorizationToken", "ecr:BatchCheckLayerAvailability",
                          "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage", "logs:CreateLogStream",
                          "logs:PutLogEvents", "secretsmanager:GetSecretValue"}
# Actions that take no resource: "*" is their only form.
NO_RESOURCE_ACTIONS = {"ecr:GetAuthorizationToken", "lambda:ListEventSourceMappings"}
# Actions on "*" narrowed by a condition on the function (lambda:FunctionArn).
FUNCTION_CONDITION_ACTIONS = {"lambda:CreateEventSourceMapping", "lambda:DeleteEventSourceMapping"}
# Object-name prefixes a policy may narrow a bucket's objects to: the segmentation products'
# objects (fragments, stale marks, skip records, specs), what the rebuild function writes.
OBJECT_PREFIXES = {"_ndstore-seg&"}


@cache
def boto_client(service: str) -> Any:
    """A client object for its API model only: made locally, it never sends a request."""
    return boto3.session.Session().client(service, region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
                                          aws_access_key_id="x", aws_secret_access_key="x")


def _function_bodies(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{node.name}.{item.name}", item


def _services_of(tree: ast.Module) -> set[str]:
    return {str(c.args[0].value) for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
            and c.func.id == "aws_client" and c.args and isinstance(c.args[0], ast.Constant)}


def _operations(node: ast.AST, service: str) -> set[str]:
    """API operations of `service` that the code under `node` names: client methods, paginators, waiters."""
    client = boto_client(service)
    methods = client.meta.method_to_api_mapping
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in methods:
            found.add(methods[sub.attr])
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.args
                and isinstance(sub.args[0], ast.Constant)):
            if sub.func.attr == "get_paginator":
                found.add(methods[sub.args[0].value])
            elif sub.func.attr == "get_waiter":
                found.add(client.get_waiter(sub.args[0].value).config.operation)
    return found


@cache
def code_actions() -> dict[str, set[str]]:
    """IAM actions per function of ndstore/storage ("module:Class.method" or "module:function")."""
    out: dict[str, set[str]] = {}
    for path in sorted(STORAGE_CODE.glob("*.py")):
        tree = ast.parse(path.read_text())
        services = _services_of(tree)
        assert len(services) <= 1, f"{path.name} makes clients of {services}: attribute its calls per client"
        for service in services:
            for qualname, body in _function_bodies(tree):
                actions = {ACTION_OF_OPERATION.get((service, op), f"{service}:{op}")
                           for op in _operations(body, service)}
                if actions:
                    out[f"{path.stem}:{qualname}"] = actions
    return out


def actions_of(*prefixes: str) -> set[str]:
    """The actions of every function whose name starts with one of the prefixes."""
    return {a for name, acts in code_actions().items() if name.startswith(prefixes) for a in acts}


def all_code_actions() -> set[str]:
    return actions_of("")


def test_the_scan_finds_the_adapters_calls() -> None:
    found = all_code_actions()
    assert {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "dynamodb:BatchWriteItem",
            "dynamodb:Query", "dynamodb:DescribeTable", "dynamodb:UpdateItem", "sqs:CreateQueue",
            "sqs:SendMessage", "lambda:CreateEventSourceMapping"} <= found, found
    # create-if-missing lives in the start-up checks only
    for action in CREATE_IF_MISSING:
        owners = {name for name, acts in code_actions().items() if action in acts}
        assert owners and all(n.endswith((".ensure_ready", ":ensure_table")) for n in owners), (action, owners)


def test_boto3_clients_are_made_only_in_the_storage_adapters() -> None:
    """The scan sees every AWS call only if the adapters are the only place clients are made."""
    services = set(boto3.session.Session().get_available_services())
    for path in [*ROOT.glob("ndstore/**/*.py"), *ROOT.glob("blaze/**/*.py"), *ROOT.glob("lambdas/**/*.py")]:
        if path.parent == STORAGE_CODE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in ("client", "resource", "aws_client"):
                    assert node.args[0].value not in services, f"{path.relative_to(ROOT)} makes a boto3 client"


def test_transactions_hold_update_items_only() -> None:
    """What ACTION_OF_OPERATION assumes of TransactWriteItems."""
    for path in STORAGE_CODE.glob("*.py"):
        text = path.read_text()
        if "transact_write_items" in text:
            keys = {k.value for d in ast.walk(ast.parse(text)) if isinstance(d, ast.Dict)
                    for k in d.keys if isinstance(k, ast.Constant)}
            assert "Update" in keys and not keys & {"Put", "Delete", "ConditionCheck"}, path.name


# --- IAM in the templates ------------------------------------------------------------------------

def statements(name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(owner, statement) of every policy in a template: SAM functions' inline policies, roles'
    inline policies, managed policies."""
    for lid, res in template(name)["Resources"].items():
        props = res.get("Properties", {})
        if res["Type"] == "AWS::Serverless::Function":
            for policy in props.get("Policies", []):
                if isinstance(policy, dict):
                    yield from ((lid, s) for s in policy.get("Statement", []))
        elif res["Type"] == "AWS::IAM::Role":
            for policy in props.get("Policies", []):
                yield from ((lid, s) for s in policy["PolicyDocument"]["Statement"])
        elif res["Type"] in ("AWS::IAM::ManagedPolicy", "AWS::IAM::Policy"):
            yield from ((lid, s) for s in props["PolicyDocument"]["Statement"])


def execution_roles(name: str) -> set[str]:
    return {td["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"][0]
            for td in resources(name, "AWS::ECS::TaskDefinition").values()}


def test_every_action_is_one_the_code_calls() -> None:
    code = all_code_actions() - CREATE_IF_MISSING
    for name in TEMPLATES:
        agent = execution_roles(name)
        for owner, statement in statements(name):
            assert statement["Effect"] == "Allow", (name, owner)
            actions = set(as_list(statement["Action"]))
            assert not any("*" in a for a in actions), (name, owner, actions)
            allowed = EXECUTION_ROLE_ACTIONS if owner in agent else code
            assert actions <= allowed, f"{name} {owner}: {actions - allowed} is not called by the code"


def _names_in(value: Any) -> set[str]:
    """Parameters and resources an ARN expression refers to (and the stack's name, which names
    ingest.yaml's tile bucket)."""
    if isinstance(value, str):
        return {n.split(".")[0] for n in re.findall(r"\$\{([^}]+)\}", value)
                if n == "AWS::StackName" or not n.startswith("AWS::")}
    if isinstance(value, dict):
        if "Ref" in value:
            return {value["Ref"]}
        if "Fn::GetAtt" in value:
            return {value["Fn::GetAtt"][0]}
        return {n for v in value.values() for n in _names_in(v)}
    if isinstance(value, list):
        return {n for v in value for n in _names_in(v)}
    return set()


def _arn_text(resource: Any) -> str:
    if isinstance(resource, dict) and "Fn::Sub" in resource:
        return str(resource["Fn::Sub"])
    return str(resource)


def test_every_resource_is_the_stacks_own() -> None:
    for name in TEMPLATES:
        t = template(name)
        known = set(t.get("Parameters", {})) | set(t["Resources"]) | {"AWS::StackName"}
        for owner, statement in statements(name):
            actions = set(as_list(statement["Action"]))
            for resource in as_list(statement["Resource"]):
                if resource == "*":
                    conditioned = "lambda:FunctionArn" in str(statement.get("Condition"))
                    assert actions <= NO_RESOURCE_ACTIONS | (FUNCTION_CONDITION_ACTIONS if conditioned else set()), \
                        (name, owner, actions)
                    continue
                names = _names_in(resource)
                assert names and names <= known, (name, owner, resource)  # no literal or foreign ARNs
                # wildcards only for a bucket's objects (or those under one of the code's prefixes,
                # OBJECT_PREFIXES) or a prefix of the stack's queues
                assert re.sub(r"/(?:[\w&-]*)\*$|\}-\*$", "", _arn_text(resource)).count("*") == 0, \
                    (name, owner, resource)
                prefix = re.search(r"\}/([^*]+)\*$", _arn_text(resource))
                assert prefix is None or prefix.group(1) in OBJECT_PREFIXES, (name, owner, resource)


def test_s3_actions_match_their_resource_level() -> None:
    """Object actions on bucket/*, bucket actions on the bucket: the usual IAM slip, both ways."""
    for name in TEMPLATES:
        for owner, statement in statements(name):
            for action in as_list(statement["Action"]):
                if not action.startswith("s3:"):
                    continue
                for resource in as_list(statement["Resource"]):
                    on_objects = re.search(r"/[^/]*\*$", _arn_text(resource)) is not None
                    assert on_objects == (action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                                                     "s3:AbortMultipartUpload")), \
                        (name, owner, action, resource)


def _granted(name: str, owner: str, on: set[str] | None = None) -> set[str]:
    """Actions of one function's or role's own statements and of the managed policies it attaches
    (a parameter named WebNodeIngestPolicyArn is ingest.yaml's WebNodeIngestPolicy); with `on`,
    only those granted on a resource named by one of those parameters or resources."""
    granted = {a for o, s in statements(name) if o == owner
               and (on is None or any(_names_in(r) & on for r in as_list(s["Resource"])))
               for a in as_list(s["Action"])}
    for arn in template(name)["Resources"][owner]["Properties"].get("ManagedPolicyArns", []):
        policy_name, policy = (("ingest.yaml", "WebNodeIngestPolicy") if arn == {"Ref": "WebNodeIngestPolicyArn"}
                               else (name, arn["Ref"]))
        granted |= _granted(policy_name, policy, on)
    return granted


# The base tier's bucket and index, as ingest.yaml and service.yaml name them.
BASE_TIER = {"CuboidBucketName", "SupercuboidIndexTableName"}


def _base_tier_actions() -> tuple[set[str], set[str], set[str]]:
    """What the base tier's adapters call, less create-if-missing: (start-up checks, listing the
    index, everything)."""
    ready = actions_of("s3:S3ObjectStore.ensure_ready", "dynamodb:ensure_table") - CREATE_IF_MISSING
    listing = actions_of("dynamodb:DynamoSupercuboidIndex.mortons", "dynamodb:DynamoSupercuboidIndex.volumes")
    return ready, listing, actions_of("s3:", "dynamodb:") - CREATE_IF_MISSING


def test_every_function_and_task_can_build_the_services() -> None:
    """Every process builds the services (ndstore.wiring.build): HeadBucket on the base tier's
    bucket and DescribeTable on the index, or every call fails."""
    ready, _, _ = _base_tier_actions()
    assert ready == {"s3:ListBucket", "dynamodb:DescribeTable"}
    for fn in resources("ingest.yaml", "AWS::Serverless::Function"):
        assert ready <= _granted("ingest.yaml", fn, BASE_TIER), fn
    task_roles = {td["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0]
                  for td in resources("service.yaml", "AWS::ECS::TaskDefinition").values()}
    assert task_roles and not task_roles & execution_roles("service.yaml")
    for role in task_roles:
        assert ready <= _granted("service.yaml", role, BASE_TIER), role


def test_base_tier_writers_have_every_base_tier_action() -> None:
    """Readers and writers of supercuboids get every base-tier action; listing the index only
    those that list it: Query a volume's supercuboids (downsample manifests, boundingbox), Scan
    for a channel's volumes (purges, on the web nodes)."""
    _, listing, everything = _base_tier_actions()
    assert listing == {"dynamodb:Query", "dynamodb:Scan"}
    cases = (("ingest.yaml", "SupercuboidFunction", set()), ("ingest.yaml", "DownsampleFunction", {"dynamodb:Query"}),
             ("service.yaml", "WebTaskRole", listing), ("service.yaml", "TierTaskRole", set()))
    for name, owner, lists in cases:
        needed = everything - listing | lists
        granted = _granted(name, owner, BASE_TIER)
        assert needed <= granted, (owner, needed - granted)
        assert not (listing - lists) & granted, f"{owner} may list the index in a way its code never does"


def test_uploaders_need_no_aws_credentials() -> None:
    """No policy for the upload client: it holds an NDStore token only (its tiles go up with
    presigned PUTs the web nodes sign, which is why they may put tiles)."""
    for name in TEMPLATES:
        policies = resources(name, "AWS::IAM::ManagedPolicy")
        assert not [p for p in policies if "upload" in p.lower() and "client" in p.lower()], (name, policies)
    assert {"s3:PutObject"} <= _granted("ingest.yaml", "WebNodeIngestPolicy", {"TileBucket"})
    source = (ROOT / "ndstore/client/ingest.py").read_text()
    assert "boto3" not in source and "ndstore.storage" not in source


def test_the_web_nodes_ingest_policy_covers_jobs_and_builds() -> None:
    """Ingest and DownsampleRuns on a web node: queues (but the local runner's ListQueues),
    triggers, the tile index, and the tile bucket's HeadBucket and deletes (a cancelled job)."""
    needed = (actions_of("sqs:") - {"sqs:ListQueues"}) | actions_of("lambda_triggers:") \
        | (actions_of("job_state:") - CREATE_IF_MISSING) | {"s3:ListBucket", "s3:DeleteObject"}
    granted = _granted("ingest.yaml", "WebNodeIngestPolicy")
    assert needed <= granted, needed - granted


# --- the supercuboid index ------------------------------------------------------------------------

class RecordingDynamo:
    """Stands in for a DynamoDB client where no table exists: records the table the code creates."""

    def __init__(self) -> None:
        self.created: dict[str, Any] = {}

    def describe_table(self, **_: Any) -> None:
        raise ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "none"}}, "DescribeTable")

    def create_table(self, **kwargs: Any) -> None:
        self.created = kwargs

    def get_waiter(self, _name: str) -> Any:
        return SimpleNamespace(wait=lambda **_: None)


def created_table(adapter: Any) -> dict[str, Any]:
    recorder = RecordingDynamo()
    adapter._db = recorder
    adapter.ensure_ready()
    return recorder.created


def _schema(props: dict[str, Any]) -> tuple[list[Any], list[Any], str]:
    key = sorted((k["AttributeName"], k["KeyType"]) for k in props["KeySchema"])
    attributes = sorted((a["AttributeName"], a["AttributeType"]) for a in props["AttributeDefinitions"])
    return key, attributes, props["BillingMode"]


def test_index_tables_have_the_key_schema_the_code_creates() -> None:
    from ndstore.storage.dynamodb import DynamoSupercuboidIndex
    from ndstore.storage.dynamodb_label_index import DynamoLabelIndex
    from ndstore.storage.job_state import DynamoJobState

    for adapter, (name, table) in (
            (DynamoSupercuboidIndex("t", "http://127.0.0.1:9"), ("storage.yaml", "SupercuboidIndexTable")),
            (DynamoLabelIndex("t", "http://127.0.0.1:9"), ("storage.yaml", "LabelIndexTable")),
            (DynamoJobState("t", "http://127.0.0.1:9"), ("ingest.yaml", "TileIndexTable"))):
        props = template(name)["Resources"][table]["Properties"]
        assert _schema(props) == _schema(created_table(adapter)), table


def test_each_role_does_to_the_label_index_what_its_code_does() -> None:
    """Every process builds the label index (DescribeTable); the base tier's writers keep it
    around each store and the web nodes read it (GetItem, Query, BatchWriteItem); the web nodes
    register a new annotation channel and run `ndstore reindex --labels` (PutItem, UpdateItem,
    Scan); the prepare task registers older ones (PutItem, GetItem). Nothing more."""
    label = "dynamodb_label_index:DynamoLabelIndex."
    ready = actions_of("dynamodb:ensure_table") - CREATE_IF_MISSING
    keep = actions_of(f"{label}channel", f"{label}_query", "dynamodb:batch_write")
    web = actions_of(f"{label}register", f"{label}set_complete", f"{label}indexed")
    assert ready == {"dynamodb:DescribeTable"}
    assert keep == {"dynamodb:GetItem", "dynamodb:Query", "dynamodb:BatchWriteItem"}
    assert web == {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Scan"}
    cases = (("ingest.yaml", "TileUploadedFunction", ready), ("ingest.yaml", "CleanupFunction", ready),
             ("ingest.yaml", "SegmentsFunction", ready),  # a rebuild reads voxels by key, no index
             ("ingest.yaml", "SupercuboidFunction", ready | keep), ("ingest.yaml", "DownsampleFunction", ready | keep),
             ("service.yaml", "TierTaskRole", ready | keep), ("service.yaml", "WebTaskRole", ready | keep | web),
             ("service.yaml", "IngestTaskRole", ready),
             ("service.yaml", "PrepareTaskRole", ready | {"dynamodb:PutItem", "dynamodb:GetItem"}))
    for name, owner, needed in cases:
        assert _granted(name, owner, {"LabelIndexTableName"}) == needed, owner


def test_base_tier_storage_is_private_encrypted_and_kept() -> None:
    res = template("storage.yaml")["Resources"]
    table, labels = res["SupercuboidIndexTable"], res["LabelIndexTable"]
    for kept in (table, labels):
        assert kept["Properties"]["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
        assert kept["DeletionPolicy"] == kept["UpdateReplacePolicy"] == "Retain"
    bucket = res["CuboidBucket"]
    block = bucket["Properties"]["PublicAccessBlockConfiguration"]
    assert set(block) == {"BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"}
    assert all(v is True for v in block.values())
    assert bucket["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    for data in (table, bucket, res["Database"]):
        assert data["DeletionPolicy"] in ("Retain", "Snapshot")
        assert data["UpdateReplacePolicy"] == data["DeletionPolicy"]


# --- Redis ----------------------------------------------------------------------------------------

def _parameters_of(group: dict[str, Any]) -> dict[str, str]:
    ref = group["Properties"]["CacheParameterGroupName"]["Ref"]
    return dict(template("storage.yaml")["Resources"][ref]["Properties"]["Properties"])


def _output(name: str, setting: str) -> Any:
    matches = [o["Value"] for o in template(name)["Outputs"].values() if o["Description"] == setting]
    assert len(matches) == 1, (name, setting)
    return matches[0]


def test_cache_tier_is_a_cluster_and_the_blaze_buffer_a_noeviction_node() -> None:
    from ndstore.storage.redis_client import CLUSTER_SCHEME

    res = template("storage.yaml")["Resources"]
    cache_group, blaze_group = res["CacheReplicationGroup"], res["BlazeReplicationGroup"]
    assert _parameters_of(cache_group) == {"cluster-enabled": "yes", "maxmemory-policy": "noeviction"}
    assert _parameters_of(blaze_group) == {"cluster-enabled": "no", "maxmemory-policy": "noeviction"}
    assert cache_group["Properties"]["AutomaticFailoverEnabled"] and blaze_group["Properties"]["MultiAZEnabled"]
    for setting in ("NDSTORE_REDIS_URL", "NDSTORE_CACHE_REDIS_URL"):
        url = _output("storage.yaml", setting)["Fn::Sub"]
        assert url.startswith(CLUSTER_SCHEME) and "CacheReplicationGroup.ConfigurationEndPoint" in url
    assert _output("storage.yaml", "NDSTORE_BLAZE_REDIS_URL")["Fn::Sub"].startswith("redis://${BlazeReplicationGroup.")
    # redis_client.connect has no TLS form of the cluster URL: TLS on would leave the code unable to connect
    for group in (cache_group, blaze_group):
        assert group["Properties"]["TransitEncryptionEnabled"] is False


def test_watermarks_fit_under_maxmemory() -> None:
    """ElastiCache's maxmemory is 75% of a node (25% reserved); the cache manager and the
    NDBlaze buffer must stop well below it (noeviction refuses writes there)."""
    for node_type, row in template("storage.yaml")["Mappings"]["NodeMemory"].items():
        maxmemory = float(row["GiB"]) * 0.75 * 2**30
        low, high, pending = int(row["CacheLowBytes"]), int(row["CacheHighBytes"]), int(row["BlazePendingBytes"])
        assert low < high <= 0.85 * maxmemory and pending <= 0.85 * maxmemory, node_type


# --- the load balancer ----------------------------------------------------------------------------

def _service_of_target_group() -> dict[str, str]:
    return {lb["TargetGroupArn"]["Ref"]: svc["Properties"]["ServiceName"]
            for svc in resources("service.yaml", "AWS::ECS::Service").values()
            for lb in svc["Properties"].get("LoadBalancers", [])}


def _forward(actions: list[dict[str, Any]]) -> str:
    (action,) = actions
    assert action["Type"] == "forward"
    return str(action["TargetGroupArn"]["Ref"])


def alb_routes() -> dict[str, str]:
    """Path pattern -> ECS service; "" is the listener's default (everything else)."""
    by_group = _service_of_target_group()
    listener = template("service.yaml")["Resources"]["Listener"]["Properties"]
    routes = {"": by_group[_forward(listener["DefaultActions"])]}
    for rule in resources("service.yaml", "AWS::ElasticLoadBalancingV2::ListenerRule").values():
        props = rule["Properties"]
        assert props["ListenerArn"] == {"Ref": "Listener"}
        (condition,) = props["Conditions"]
        assert condition["Field"] == "path-pattern"
        for pattern in condition["PathPatternConfig"]["Values"]:
            routes[pattern] = by_group[_forward(props["Actions"])]
    return routes


def test_alb_routes_blaze_and_ingest_to_their_nodes_and_the_rest_to_the_web_nodes() -> None:
    assert alb_routes() == {"/v1/blaze/*": "blaze", "/v1/ingest/*": "ingest", "": "web"}


def test_alb_prefixes_are_nginx_s_and_the_app_serves_them() -> None:
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    urls = (ROOT / "ndstore" / "api" / "urls.py").read_text()
    for pattern in alb_routes():
        if pattern:
            prefix = pattern.rstrip("*")
            assert re.search(rf"location\s+{re.escape(prefix)}\s*{{", nginx), prefix
            assert f'"{prefix.lstrip("/")}' in urls or f"'{prefix.lstrip('/')}" in urls, prefix


def test_each_routed_service_runs_gunicorn_on_the_target_port_with_its_role() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert '"0.0.0.0:8000"' in dockerfile
    res = template("service.yaml")["Resources"]
    roles = {}
    for svc in resources("service.yaml", "AWS::ECS::Service").values():
        props = svc["Properties"]
        task = res[props["TaskDefinition"]["Ref"]]["Properties"]
        for lb in props.get("LoadBalancers", []):
            (container,) = [c for c in task["ContainerDefinitions"] if c["Name"] == lb["ContainerName"]]
            assert "Command" not in container  # the image's CMD: its front on 0.0.0.0:8000, gunicorn behind
            assert container["PortMappings"][0]["ContainerPort"] == lb["ContainerPort"] == 8000
            assert res[lb["TargetGroupArn"]["Ref"]]["Properties"]["Port"] == 8000
            role = task["TaskRoleArn"]["Fn::GetAtt"][0]
            roles[props["ServiceName"]] = _granted("service.yaml", role)
            roles[f"{props['ServiceName']} on the base tier"] = _granted("service.yaml", role, BASE_TIER)
    # the NDBlaze nodes neither create queues nor touch Lambda; the ingest nodes write no supercuboids
    # (their s3:PutObject is on the tile bucket: the presigned tile PUTs they hand out)
    assert not any(a.startswith("lambda:") for a in roles["blaze"])
    # (but queue segmentation rebuilds when they store a label channel's supercuboids)
    assert {a for a in roles["blaze"] if a.startswith("sqs:")} == {"sqs:GetQueueUrl", "sqs:SendMessage"}
    assert not {"s3:GetObject", "s3:PutObject", "dynamodb:Query"} & roles["ingest on the base tier"]


def test_health_checks_ask_healthz_with_the_checkers_host() -> None:
    """The health checker sends the task's private address as the Host: NDSTORE_ALLOWED_HOSTS
    (the load balancer's name) refuses it on every other path, but /healthz is answered ahead of
    that check, with no token and no migrated schema, and names its parts."""
    from django.test import Client, override_settings

    paths = {tg["Properties"]["HealthCheckPath"]
             for tg in resources("service.yaml", "AWS::ElasticLoadBalancingV2::TargetGroup").values()}
    assert paths == {"/healthz"}
    checker = {"HTTP_HOST": "10.0.1.23:8000"}
    with override_settings(ALLOWED_HOSTS=["ndstore-123.us-east-1.elb.amazonaws.com"], DEBUG=False):
        client = Client()
        r = client.get("/healthz", **checker)
        assert r.status_code in (200, 503) and {"database", "object_store"} <= set(r.json()["parts"])
        assert client.get("/", **checker).status_code == 400  # why it must be answered first


# --- ECS --------------------------------------------------------------------------------------------

def container_definitions() -> Iterator[tuple[str, dict[str, Any]]]:
    for lid, td in resources("service.yaml", "AWS::ECS::TaskDefinition").items():
        for container in td["Properties"]["ContainerDefinitions"]:
            yield lid, container


def test_containers_run_commands_that_exist() -> None:
    import click

    from ndstore.cli import main

    commands = [c["Command"] for _, c in container_definitions() if "Command" in c]
    assert len(commands) == 3
    for command in commands:
        assert command[:2] == ["python", "-m"], command
        if command[2] == "django":
            assert (ROOT / "ndstore/api/management/commands" / f"{command[3]}.py").exists(), command
            continue
        assert command[2] == "ndstore.cli", command
        group: click.Command = main
        for word in command[3:]:
            assert isinstance(group, click.Group) and word in group.commands, command
            group = group.commands[word]


def test_fargate_sizes_are_valid_combinations() -> None:
    """Fargate's CPU/memory table: 1 vCPU 2-8 GiB, 2: 4-16, 4: 8-30, 8: 16-60 (4 GiB steps), 16: 32-120 (8)."""
    allowed = {1024: (2048, 8192, 1024), 2048: (4096, 16384, 1024), 4096: (8192, 30720, 1024),
               8192: (16384, 61440, 4096), 16384: (32768, 122880, 8192)}
    for size, row in template("service.yaml")["Mappings"]["TaskSizes"].items():
        low, high, step = allowed[int(row["Cpu"])]
        memory = int(row["Memory"])
        assert low <= memory <= high and memory % step == 0, size
        assert int(row["Workers"]) >= 2


# --- settings -------------------------------------------------------------------------------------

# Read by libraries from the environment, not by our code.
LIBRARY_SETTINGS = {"DATABASE_URL"}  # dj_database_url.config() in ndstore/api/settings/base.py


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


@cache
def settings_read_by_code() -> frozenset[str]:
    """Names the code reads from the environment: os.environ[...] / .get / getenv / config's _env."""
    names = set()
    paths = [*ROOT.glob("ndstore/**/*.py"), *ROOT.glob("blaze/**/*.py"), *ROOT.glob("lambdas/**/*.py"),
             ROOT / "deploy" / "gunicorn.conf.py"]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.slice, ast.Constant):
                names.add(str(node.slice.value))
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = node.func
                if ((isinstance(func, ast.Attribute) and func.attr in ("get", "setdefault") and _is_environ(func.value))
                        or (isinstance(func, ast.Attribute) and func.attr == "getenv")
                        or (isinstance(func, ast.Name) and func.id == "_env")):
                    names.add(str(node.args[0].value))
    return frozenset(names)


def template_settings(name: str) -> dict[str, Any]:
    """Every environment variable a template sets, with its value."""
    t = template(name)
    env = dict(t.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {}))
    for res in t["Resources"].values():
        if res["Type"] in ("AWS::Serverless::Function", "AWS::Lambda::Function"):
            env |= res["Properties"].get("Environment", {}).get("Variables", {})
    for _, container in (container_definitions() if name == "service.yaml" else iter(())):
        env |= {e["Name"]: e["Value"] for e in container.get("Environment", [])}
        env |= {s["Name"]: s["ValueFrom"] for s in container.get("Secrets", [])}
    return env


def test_library_settings_are_read_by_the_library() -> None:
    assert "dj_database_url.config(" in (ROOT / "ndstore/api/settings/base.py").read_text()


@pytest.mark.parametrize("name", TEMPLATES)
def test_templates_set_only_settings_the_code_reads(name: str) -> None:
    known = settings_read_by_code() | LIBRARY_SETTINGS
    assert "NDSTORE_S3_BUCKET" in known and "AWS_DEFAULT_REGION" in known  # the scan works
    env = template_settings(name)
    if name != "storage.yaml":
        assert env
    assert not set(env) - known, f"{name} sets what nothing reads: {set(env) - known}"
    outputs = {setting for o in template(name).get("Outputs", {}).values()
               for setting in re.findall(r"^NDSTORE_\w+", o["Description"])}  # the rest are for operators
    assert outputs <= known, outputs - known


@pytest.mark.parametrize("name", TEMPLATES)
def test_settings_come_from_the_parameter_that_names_them(name: str) -> None:
    """A setting set from a parameter names it in that parameter's description; a description
    that names another template's output ("NDSTORE_X (storage.yaml)") names one that exists."""
    params = template(name).get("Parameters", {})
    for setting, value in template_settings(name).items():
        if isinstance(value, dict) and value.get("Ref") in params:
            assert setting in params[value["Ref"]].get("Description", ""), (name, setting, value)
    for spec in params.values():
        match = re.match(r"((?:NDSTORE_\w+|DATABASE_URL)).*?\((storage|ingest)\.yaml", spec.get("Description", ""))
        if match:
            setting, source = match.groups()
            _output(f"{source}.yaml", setting)


def test_service_and_ingest_stacks_share_the_queue_prefix_default() -> None:
    assert default("service.yaml", {"Ref": "QueuePrefix"}) == default("ingest.yaml", {"Ref": "QueuePrefix"})


def test_job_queues_outlast_the_functions_they_trigger() -> None:
    """Lambda refuses an SQS trigger whose queue's visibility timeout is below the function's
    timeout: the queues a job creates carry NDSTORE_INGEST_VISIBILITY_S."""
    own_trigger = {m["Properties"]["FunctionName"]["Ref"]
                   for m in resources("ingest.yaml", "AWS::Lambda::EventSourceMapping").values()}
    queue_triggered = [fn["Properties"] for lid, fn in resources("ingest.yaml", "AWS::Serverless::Function").items()
                       if not fn["Properties"].get("Events") and lid not in own_trigger]
    assert len(queue_triggered) == 3
    visibility = template("service.yaml")["Parameters"]["IngestVisibilitySeconds"]
    assert int(visibility["MinValue"]) >= max(int(p["Timeout"]) for p in queue_triggered)
    assert int(visibility["Default"]) >= int(visibility["MinValue"])



# --- segmentation products ------------------------------------------------------------------------

def test_the_segments_queue_is_the_one_the_code_looks_up_with_its_dead_letter_queue() -> None:
    """`ProductUpkeep` looks up `<prefix>-seg` (ndstore/wiring.py) and creates it only where it is
    missing; the stack makes it, encrypted, with a dead-letter queue named as the code names one."""
    res = template("ingest.yaml")["Resources"]
    queue, dlq = res["SegmentsQueue"]["Properties"], res["SegmentsDeadLetterQueue"]["Properties"]
    assert 'f"{config.ingest_queue_prefix}-seg"' in (ROOT / "ndstore/wiring.py").read_text()
    assert queue["QueueName"] == {"Fn::Sub": "${QueuePrefix}-seg"}
    assert 'QueueName=f"{name}-dlq"' in (STORAGE_CODE / "sqs.py").read_text()
    assert dlq["QueueName"] == {"Fn::Sub": "${QueuePrefix}-seg-dlq"}
    assert queue["SqsManagedSseEnabled"] is True and dlq["SqsManagedSseEnabled"] is True
    assert queue["RedrivePolicy"]["deadLetterTargetArn"] == {"Fn::GetAtt": ["SegmentsDeadLetterQueue", "Arn"]}
    assert 2 <= int(queue["RedrivePolicy"]["maxReceiveCount"]) <= 5
    assert int(dlq["MessageRetentionPeriod"]) > int(queue["MessageRetentionPeriod"])


def test_the_segments_function_is_triggered_by_its_queue_in_small_partial_batches() -> None:
    res = template("ingest.yaml")["Resources"]
    fn = res["SegmentsFunction"]
    assert handler_of(fn) == "lambdas.segments.rebuild" and fn["Properties"]["PackageType"] == "Image"
    assert int(fn["Properties"]["MemorySize"]) >= 3008 and int(fn["Properties"]["Timeout"]) >= 300
    [trigger] = [m["Properties"] for m in resources("ingest.yaml", "AWS::Lambda::EventSourceMapping").values()
                 if m["Properties"]["FunctionName"] == {"Ref": "SegmentsFunction"}]
    assert trigger["EventSourceArn"] == {"Fn::GetAtt": ["SegmentsQueue", "Arn"]}
    assert trigger["FunctionResponseTypes"] == ["ReportBatchItemFailures"]  # lambdas/events.py answers so
    assert 1 <= int(trigger["BatchSize"]) <= 4
    assert int(default("ingest.yaml", trigger["ScalingConfig"]["MaximumConcurrency"])) >= 2
    # Lambda refuses a trigger whose queue's visibility is below the function's timeout
    assert int(res["SegmentsQueue"]["Properties"]["VisibilityTimeout"]) >= 6 * int(fn["Properties"]["Timeout"])
    # its role polls its own queue only (SAM's SQS event would attach a managed policy on "*")
    assert not fn["Properties"].get("Events")
    polled = {a for o, st in statements("ingest.yaml")
              if o == "SegmentsFunction" and st["Resource"] == {"Fn::GetAtt": ["SegmentsQueue", "Arn"]}
              for a in as_list(st["Action"]) if a.startswith("sqs:")}
    assert polled == {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}


def test_the_segments_function_reads_the_base_tier_and_writes_only_its_products() -> None:
    """Supercuboids, marks and specs read; fragments, skip records and marks written and deleted
    under `_ndstore-seg&` only: a rebuild never writes a supercuboid."""
    by_resource: dict[str, set[str]] = {}
    for owner, st in statements("ingest.yaml"):
        if owner == "SegmentsFunction":
            for r in as_list(st["Resource"]):
                by_resource.setdefault(_arn_text(r), set()).update(
                    a for a in as_list(st["Action"]) if a.startswith("s3:"))
    objects = "arn:${AWS::Partition}:s3:::${CuboidBucketName}"
    assert by_resource[f"{objects}/*"] == {"s3:GetObject"}
    assert by_resource[f"{objects}/_ndstore-seg&*"] == {"s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"}
    from ndstore.engine.segments.fragments import PREFIX
    assert PREFIX in OBJECT_PREFIXES


SEG_QUEUE_ACTIONS = {"sqs:GetQueueUrl", "sqs:SendMessage"}


def _granted_on_seg_queue(name: str, owner: str) -> set[str]:
    """Actions on a resource that covers `<QueuePrefix>-seg` (it, or `<QueuePrefix>-*`)."""
    def covers(resource: Any) -> bool:
        return _arn_text(resource).endswith(("${QueuePrefix}-seg", "${QueuePrefix}-*"))

    granted = {a for o, st in statements(name) if o == owner and any(covers(r) for r in as_list(st["Resource"]))
               for a in as_list(st["Action"])}
    for arn in template(name)["Resources"][owner]["Properties"].get("ManagedPolicyArns", []):
        if arn == {"Ref": "WebNodeIngestPolicyArn"}:
            granted |= _granted_on_seg_queue("ingest.yaml", "WebNodeIngestPolicy")
    return granted


def test_every_writer_of_supercuboids_can_queue_rebuilds() -> None:
    """A store of a label channel's supercuboid marks fragments stale and queues their rebuild
    (ProductUpkeep.changed): every role that writes the base tier looks the queue up and sends."""
    writers = [("ingest.yaml", "SupercuboidFunction"), ("ingest.yaml", "DownsampleFunction"),
               ("service.yaml", "TierTaskRole"), ("service.yaml", "WebTaskRole")]
    for name, owner in writers:
        assert "s3:PutObject" in _granted(name, owner, BASE_TIER), owner
        missing = SEG_QUEUE_ACTIONS - _granted_on_seg_queue(name, owner)
        assert not missing, (owner, missing)
    # and nothing else writes supercuboids (else it would need the queue too)
    for name, kind in (("ingest.yaml", "AWS::Serverless::Function"), ("service.yaml", "AWS::IAM::Role")):
        for owner in resources(name, kind):
            if (name, owner) not in writers and owner != "SegmentsFunction":
                assert "s3:PutObject" not in _granted(name, owner, {"CuboidBucketName"}), owner


def test_the_web_nodes_see_and_purge_segmentation_products() -> None:
    """The status route and /metrics count the queue (GetQueueAttributes); the status route and a
    channel's purge list the bucket under `_ndstore-seg&`; a build asked for queues (SendMessage)."""
    assert {"sqs:GetQueueAttributes", *SEG_QUEUE_ACTIONS} <= _granted_on_seg_queue("service.yaml", "WebTaskRole")
    assert {"s3:ListBucket", "s3:GetObject", "s3:DeleteObject"} <= _granted("service.yaml", "WebTaskRole",
                                                                            {"CuboidBucketName"})


def test_every_process_that_stores_supercuboids_queues_on_sqs() -> None:
    """Without NDSTORE_INGEST_BACKEND=aws a process's queues are SQLite files on its own disk
    (config.py: `local` unless an endpoint is set): its rebuilds would never reach SegmentsQueue."""
    assert template("ingest.yaml")["Globals"]["Function"]["Environment"]["Variables"]["NDSTORE_INGEST_BACKEND"] \
        == "aws"
    for family, container in container_definitions():
        env = {e["Name"]: e["Value"] for e in container.get("Environment", [])}
        if "prepare" in family.lower():  # ndstore_prepare stores no supercuboid
            continue
        assert env.get("NDSTORE_INGEST_BACKEND") == "aws", family
        assert env.get("NDSTORE_INGEST_QUEUE_PREFIX") == {"Ref": "QueuePrefix"}, family

# --- the cost model -------------------------------------------------------------------------------

def cost_model() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cost_model", AWS / "cost_model.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["cost_model"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_cost_model_lines_add_up_to_its_total() -> None:
    result = subprocess.run([sys.executable, str(AWS / "cost_model.py")], capture_output=True, text=True,
                            timeout=60, check=True)
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines() if line.startswith("| ")]
    header, *lines, last = rows
    assert header[2].strip() == "USD per month" and last[0].strip() == "**total**"
    costs = [float(row[2].replace(",", "")) for row in lines]
    total = float(last[2].strip("* ").replace(",", ""))
    assert len(costs) >= 15 and all(c > 0 for c in costs)
    assert abs(sum(costs) - total) < 0.005, (sum(costs), total)
    assert "list prices as known in 2026" in result.stdout and "Pricing Calculator" in result.stdout


def _fargate_defaults() -> dict[str, tuple[int, int, int]]:
    sizes = template("service.yaml")["Mappings"]["TaskSizes"]
    res = template("service.yaml")["Resources"]
    out = {}
    for svc in resources("service.yaml", "AWS::ECS::Service").values():
        props = svc["Properties"]
        task = res[props["TaskDefinition"]["Ref"]]["Properties"]
        size = sizes[default("service.yaml", task["Cpu"]["Fn::FindInMap"][1])]
        out[props["ServiceName"]] = (int(default("service.yaml", props["DesiredCount"])), int(size["Cpu"]) // 1024,
                                     int(size["Memory"]) // 1024)
    return out


def test_cost_model_prices_the_templates_defaults() -> None:
    model = cost_model()
    assert model.FARGATE_SERVICES == _fargate_defaults()
    storage = template("storage.yaml")
    params, res = storage["Parameters"], storage["Resources"]
    assert model.CACHE_NODE_TYPE == params["CacheNodeType"]["Default"]
    assert model.CACHE_SHARDS == params["CacheShards"]["Default"]
    assert model.CACHE_REPLICAS_PER_SHARD == params["CacheReplicasPerShard"]["Default"]
    assert model.BLAZE_NODE_TYPE == params["BlazeNodeType"]["Default"]
    assert model.BLAZE_NODES == res["BlazeReplicationGroup"]["Properties"]["NumCacheClusters"]
    assert model.DATABASE_CLASS == params["DatabaseInstanceClass"]["Default"]
    assert model.DATABASE_GB == int(res["Database"]["Properties"]["AllocatedStorage"])
    assert res["Database"]["Properties"]["MultiAZ"] is True  # the model prices Multi-AZ
    secrets = [lid for name in TEMPLATES for lid in resources(name, "AWS::SecretsManager::Secret")]
    assert model.SECRETS == len(secrets)
    phase = {"parent": "downsample"}
    memory = {phase.get(h, h): fn["Properties"]["MemorySize"] for fn in
              resources("ingest.yaml", "AWS::Serverless::Function").values()
              for h in [handler_of(fn).rsplit(".", 1)[1]]}
    assert model.LAMBDA_MEMORY_MB == memory
    for node_type in (model.CACHE_NODE_TYPE, model.BLAZE_NODE_TYPE):
        assert node_type in model.ELASTICACHE_NODE_HOUR


def test_cost_model_tiers() -> None:
    model = cost_model()
    tiers = ((10.0, 2.0), (float("inf"), 1.0))
    assert model.tiered(5, tiers) == 10 and model.tiered(15, tiers) == 25

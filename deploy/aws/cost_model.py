"""What the AWS deployment of deploy/aws/ costs per month: the sizes the templates deploy by
default (storage.yaml, ingest.yaml, service.yaml; tests/deploy/test_aws.py keeps them equal),
a workload stated as assumptions, and AWS us-east-1 on-demand list prices.

The prices are list prices as known in 2026, written down without internet access: they are not
quotes. Check every one in the AWS Pricing Calculator (https://calculator.aws/) before relying on
the result. No free tier is applied; no savings plans, reserved nodes or spot.

    python deploy/aws/cost_model.py      # prints a markdown table and its total

Pure Python, no dependencies: the parameters first, then the prices, then the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- the deployment: the templates' defaults ---------------------------------------------------
# ECS Fargate services of service.yaml: tasks, vCPU and GiB per task (its TaskSizes mapping).
FARGATE_SERVICES: dict[str, tuple[int, int, int]] = {
    "web": (4, 8, 32),  # WebNodes, WebTaskSize vcpu8 (scales out to WebNodesMax on CPU)
    "blaze": (2, 4, 16),  # BlazeNodes, BlazeTaskSize vcpu4
    "ingest": (2, 1, 4),  # IngestNodes, IngestTaskSize vcpu1
    "daemons": (1, 2, 8),  # the write-back flusher and the cache manager, DaemonsTaskSize vcpu2
    "merger": (1, 8, 32),  # the NDBlaze merger, Spark local[*], MergerTaskSize vcpu8
}
CACHE_NODE_TYPE = "cache.r7g.xlarge"  # storage.yaml: the cache tier's Redis cluster
CACHE_SHARDS = 3
CACHE_REPLICAS_PER_SHARD = 1
BLAZE_NODE_TYPE = "cache.r7g.large"  # storage.yaml: the NDBlaze buffer, a primary and a replica
BLAZE_NODES = 2
DATABASE_CLASS = "db.t4g.medium"  # storage.yaml: PostgreSQL, Multi-AZ, 20 GB gp3
DATABASE_GB = 20
SECRETS = 4  # database password, DATABASE_URL, NDSTORE_SECRET_KEY, NDSTORE_ADMIN_TOKEN
LOAD_BALANCERS = 1
NAT_GATEWAYS = 1  # the VPC's (not in the templates); S3 and DynamoDB go through gateway endpoints
LAMBDA_MEMORY_MB = {"tile_uploaded": 512, "supercuboid": 3008, "cleanup": 256, "downsample": 3008,  # ingest.yaml
                    "rebuild": 3008}

# --- the workload: assumptions, change them ------------------------------------------------------
TB = 2**40  # bytes; AWS bills storage and transfer by the GB of 2**30 bytes
GB = 2**30
STORED_TB = 100.0  # compressed supercuboids in the base tier
SUPERCUBOID_RAW_BYTES = 512 * 512 * 64  # 4x4x4 cuboids of 128x128x16 uint8 (ndstore/core/geometry.py)
COMPRESSION = 0.73  # stored / raw; zstd-1 on EM-like data (DESIGN.md)
BASE_READ_TB = 50.0  # read from S3 per month: cache misses, direct and raw reads, merges
# an object is read as two ranged GETs at once (NDSTORE_S3_PART_BYTES, 8 MiB: a ~12 MB supercuboid
# is two parts; a smaller one a part and a guess past its end); written as one PUT (no multipart)
S3_GETS_PER_OBJECT_READ = 2
BASE_WRITE_TB = 10.0  # written to S3 per month: write-backs, direct writes, NDBlaze merges
TRANSFER_OUT_TB = 10.0  # responses leaving AWS to the internet per month
UPLOAD_IN_TB = 2.0  # request bodies (cutout writes) through the load balancer; ingress is free
CROSS_ZONE_FRACTION = 2 / 3  # of the bytes between nodes and Redis: nodes and shards in 3 zones
NAT_GB = 200.0  # through the NAT gateway: image pulls, SQS, Lambda API, logs, secrets
LOG_GB = 50.0  # CloudWatch Logs ingested per month (kept 30 days)
IMAGE_GB = 2.0  # the service's image and the segments function's (about 0.5 GB) in ECR

# Ingest of INGEST_TB_PER_MONTH of raw uint8 tiles, 512x512 each (64 tiles per supercuboid), and
# the downsampling of what it ingested (anisotropic: a parent per 4 children, about 1/3 as many).
INGEST_TB_PER_MONTH = 1.0
TILE_BYTES = 512 * 512
TILE_RESIDENCY_DAYS = 1.0  # a tile lives in the tile bucket from its upload to its cleanup
LAMBDA_SECONDS = {"tile_uploaded": 0.1, "supercuboid": 3.0, "cleanup": 0.3, "downsample": 2.0, "rebuild": 15.0}
# Segmentation products of label channels: a stored label supercuboid queues the rebuild of its own
# fragments and of its seven low-side neighbours' (ndstore/engine/segments/upkeep.py); meshing and
# skeletonizing one supercuboid of dense labels takes seconds to tens of seconds.
SEGMENT_REBUILDS_PER_MONTH = 200_000
# Tile index (DynamoDB, on demand): a transaction of two items costs 2 write units per item.
TILE_WRITE_UNITS = 4.0  # record_tile: tile row + job counter, transactionally
TILE_READ_UNITS = 3.0  # has_tile (client), the supercuboid's row (handler), the job's spec
SUPERCUBOID_WRITE_UNITS = 11.0  # claim, queued, built and cleaned (transactions), row delete
SUPERCUBOID_READ_UNITS = 3.0
SQS_REQUESTS_PER_TILE = 1.3  # manifest (batches of 10), receive (10 at once), delete
SQS_REQUESTS_PER_SUPERCUBOID = 6.0  # send, poll, delete on two queues

# --- prices: us-east-1, on demand, USD (list prices as known in 2026; check them) ---------------
HOURS = 730  # per month
FARGATE_VCPU_HOUR = 0.04048  # Linux/x86
FARGATE_GB_HOUR = 0.004445
ELASTICACHE_NODE_HOUR = {"cache.r7g.large": 0.219, "cache.r7g.xlarge": 0.437, "cache.r7g.2xlarge": 0.873,
                         "cache.r7g.4xlarge": 1.747}
RDS_MULTI_AZ_HOUR = {"db.t4g.medium": 0.130, "db.t4g.large": 0.258, "db.m7g.large": 0.336}
RDS_MULTI_AZ_GP3_GB_MONTH = 0.23
S3_STANDARD_GB_MONTH = ((50 * 1024, 0.023), (450 * 1024, 0.022), (float("inf"), 0.021))  # tiers
S3_PUT_PER_1000 = 0.005
S3_GET_PER_1000 = 0.0004  # GET and HEAD; DELETE is free
DYNAMODB_WRITE_PER_MILLION = 0.625  # on-demand write request units
DYNAMODB_READ_PER_MILLION = 0.125
DYNAMODB_GB_MONTH = 0.25
DYNAMODB_PITR_GB_MONTH = 0.20
INDEX_ITEM_BYTES = 120  # volume, morton, object key and DynamoDB's per-item overhead
LAMBDA_GB_SECOND = 0.0000166667  # x86
LAMBDA_PER_MILLION = 0.20
SQS_PER_MILLION = 0.40
ALB_HOUR = 0.0225
ALB_LCU_HOUR = 0.008  # one LCU processes 1 GB per hour (the bytes dimension, dominant here)
NAT_HOUR = 0.045
NAT_GB_PROCESSED = 0.045
TRANSFER_OUT_GB = ((10 * 1024, 0.09), (40 * 1024, 0.085), (100 * 1024, 0.07), (float("inf"), 0.05))
CROSS_ZONE_GB = 0.02  # 0.01 out of one zone + 0.01 into the other
SECRET_MONTH = 0.40
LOGS_INGEST_GB = 0.50
LOGS_GB_MONTH = 0.03
ECR_GB_MONTH = 0.10


@dataclass(frozen=True)
class Line:
    item: str
    quantity: str
    usd: float


def tiered(amount: float, tiers: tuple[tuple[float, float], ...]) -> float:
    """Cost of `amount` units under (tier size, price per unit) tiers, in order."""
    cost, left = 0.0, amount
    for size, price in tiers:
        used = min(left, size)
        cost += used * price
        left -= used
        if left <= 0:
            break
    return cost


def compute_lines() -> list[Line]:
    out = []
    for name, (tasks, vcpu, gib) in FARGATE_SERVICES.items():
        hourly = tasks * (vcpu * FARGATE_VCPU_HOUR + gib * FARGATE_GB_HOUR)
        out.append(Line(f"Fargate: {name}", f"{tasks} x {vcpu} vCPU / {gib} GiB", hourly * HOURS))
    cache_nodes = CACHE_SHARDS * (1 + CACHE_REPLICAS_PER_SHARD)
    out.append(Line("ElastiCache: cache tier + locks", f"{cache_nodes} x {CACHE_NODE_TYPE} ({CACHE_SHARDS} shards)",
                    cache_nodes * ELASTICACHE_NODE_HOUR[CACHE_NODE_TYPE] * HOURS))
    out.append(Line("ElastiCache: NDBlaze buffer", f"{BLAZE_NODES} x {BLAZE_NODE_TYPE}",
                    BLAZE_NODES * ELASTICACHE_NODE_HOUR[BLAZE_NODE_TYPE] * HOURS))
    out.append(Line("RDS PostgreSQL (metadata)", f"{DATABASE_CLASS} Multi-AZ, {DATABASE_GB} GB gp3",
                    RDS_MULTI_AZ_HOUR[DATABASE_CLASS] * HOURS + DATABASE_GB * RDS_MULTI_AZ_GP3_GB_MONTH))
    out += base_tier_lines() + ingest_lines() + segment_lines() + network_lines()
    out.append(Line("Secrets Manager", f"{SECRETS} secrets", SECRETS * SECRET_MONTH))
    out.append(Line("CloudWatch Logs + ECR", f"{LOG_GB:g} GB logs, {IMAGE_GB:g} GB image",
                    LOG_GB * (LOGS_INGEST_GB + LOGS_GB_MONTH) + IMAGE_GB * ECR_GB_MONTH))
    return [Line(line.item, line.quantity, round(line.usd, 2)) for line in out]


def stored_supercuboid_bytes() -> float:
    return SUPERCUBOID_RAW_BYTES * COMPRESSION


def base_tier_lines() -> list[Line]:
    stored_gb = STORED_TB * TB / GB
    objects = STORED_TB * TB / stored_supercuboid_bytes()
    gets = BASE_READ_TB * TB / stored_supercuboid_bytes() * S3_GETS_PER_OBJECT_READ
    puts = BASE_WRITE_TB * TB / stored_supercuboid_bytes()
    index_gb = objects * INDEX_ITEM_BYTES / GB
    return [
        Line("S3: supercuboids stored", f"{STORED_TB:g} TB Standard", tiered(stored_gb, S3_STANDARD_GB_MONTH)),
        Line("S3: base-tier requests", f"{gets / 1e6:.2f} M GET, {puts / 1e6:.2f} M PUT",
             gets / 1000 * S3_GET_PER_1000 + puts / 1000 * S3_PUT_PER_1000),
        Line("DynamoDB: supercuboid index", f"{objects / 1e6:.1f} M items, PITR, {puts / 1e6:.2f} M writes",
             index_gb * (DYNAMODB_GB_MONTH + DYNAMODB_PITR_GB_MONTH) + puts / 1e6 * DYNAMODB_WRITE_PER_MILLION),
    ]


def ingest_lines() -> list[Line]:
    tiles = INGEST_TB_PER_MONTH * TB / TILE_BYTES
    supercuboids = INGEST_TB_PER_MONTH * TB / SUPERCUBOID_RAW_BYTES
    parents = supercuboids / 3
    # One invocation per tile (an S3 event each) and per task (SQS batches of one at worst).
    invocations = {"tile_uploaded": tiles, "supercuboid": supercuboids, "cleanup": supercuboids,
                   "downsample": parents}
    tb = f"{INGEST_TB_PER_MONTH:g} TB"
    out = []
    for phase, calls in invocations.items():
        memory_mb, seconds = LAMBDA_MEMORY_MB[phase], LAMBDA_SECONDS[phase]
        gb_seconds = calls * seconds * memory_mb / 1024
        out.append(Line(f"Lambda {phase} ({tb} of tiles)",
                        f"{calls / 1e6:.3f} M calls x {seconds:g} s x {memory_mb} MB = {gb_seconds / 1e3:.1f} k GB-s",
                        gb_seconds * LAMBDA_GB_SECOND + calls / 1e6 * LAMBDA_PER_MILLION))
    tile_gb = INGEST_TB_PER_MONTH * TB / GB
    s3 = (tiles * S3_PUT_PER_1000 + 2 * tiles * S3_GET_PER_1000  # PUT, HEAD and GET of each tile
          + supercuboids * S3_PUT_PER_1000 + parents * (4 * S3_GET_PER_1000 + S3_PUT_PER_1000)) / 1000
    s3 += tile_gb * S3_STANDARD_GB_MONTH[0][1] * TILE_RESIDENCY_DAYS / 30
    writes = tiles * TILE_WRITE_UNITS + supercuboids * SUPERCUBOID_WRITE_UNITS + supercuboids + parents * 3
    reads = tiles * TILE_READ_UNITS + supercuboids * SUPERCUBOID_READ_UNITS + parents * 2
    sqs = tiles * SQS_REQUESTS_PER_TILE + (supercuboids + parents) * SQS_REQUESTS_PER_SUPERCUBOID
    return out + [
        Line(f"S3: tiles of {tb}, downsample requests", f"{tiles / 1e6:.2f} M tiles of {TILE_BYTES} bytes", s3),
        Line("DynamoDB: tile index", f"{writes / 1e6:.1f} M write, {reads / 1e6:.1f} M read units",
             writes / 1e6 * DYNAMODB_WRITE_PER_MILLION + reads / 1e6 * DYNAMODB_READ_PER_MILLION),
        Line("SQS: ingest and downsample queues", f"{sqs / 1e6:.1f} M requests", sqs / 1e6 * SQS_PER_MILLION),
    ]


def segment_lines() -> list[Line]:
    calls, memory_mb, seconds = SEGMENT_REBUILDS_PER_MONTH, LAMBDA_MEMORY_MB["rebuild"], LAMBDA_SECONDS["rebuild"]
    gb_seconds = calls * seconds * memory_mb / 1024
    # per rebuild: GET of the mark, the spec (cached) and 8 supercuboids at most; PUT of two
    # fragments; SQS send, receive, delete
    s3 = calls * (10 * S3_GET_PER_1000 + 3 * S3_PUT_PER_1000) / 1000
    return [
        Line("Lambda rebuild (segmentation products)",
             f"{calls / 1e6:.3f} M calls x {seconds:g} s x {memory_mb} MB = {gb_seconds / 1e3:.1f} k GB-s",
             gb_seconds * LAMBDA_GB_SECOND + calls / 1e6 * LAMBDA_PER_MILLION),
        Line("S3 + SQS: segmentation rebuilds", f"{calls / 1e6:.2f} M rebuilds",
             s3 + 3 * calls / 1e6 * SQS_PER_MILLION),
    ]


def network_lines() -> list[Line]:
    out_gb = TRANSFER_OUT_TB * TB / GB
    alb_gb = (TRANSFER_OUT_TB + UPLOAD_IN_TB) * TB / GB
    cross_gb = CROSS_ZONE_FRACTION * alb_gb
    return [
        Line("Data transfer out to the internet", f"{TRANSFER_OUT_TB:g} TB", tiered(out_gb, TRANSFER_OUT_GB)),
        Line("Application Load Balancer", f"{LOAD_BALANCERS} ALB, {alb_gb:.0f} LCU-hours",
             LOAD_BALANCERS * ALB_HOUR * HOURS + alb_gb * ALB_LCU_HOUR),
        Line("Cross-zone traffic, nodes <-> Redis", f"{cross_gb:.0f} GB", cross_gb * CROSS_ZONE_GB),
        Line("NAT gateway", f"{NAT_GATEWAYS} gateway, {NAT_GB:g} GB",
             NAT_GATEWAYS * NAT_HOUR * HOURS + NAT_GB * NAT_GB_PROCESSED),
    ]


def total(lines: list[Line]) -> float:
    return round(sum(line.usd for line in lines), 2)


def markdown(lines: list[Line]) -> str:
    rows = ["| item | configuration / quantity | USD per month |", "|---|---|---:|"]
    rows += [f"| {line.item} | {line.quantity} | {line.usd:,.2f} |" for line in lines]
    rows.append(f"| **total** | | **{total(lines):,.2f}** |")
    return "\n".join(rows)


def main() -> None:
    print("AWS us-east-1 on-demand list prices as known in 2026 (no internet access when written; "
          "check them in the AWS Pricing Calculator). No free tier applied.\n")
    print(markdown(compute_lines()))


if __name__ == "__main__":
    main()

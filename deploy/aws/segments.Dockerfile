# The segmentation products' rebuild function (deploy/aws/ingest.yaml's SegmentsFunction) as a
# Lambda container image: its packages (lambdas/requirements-segments.txt) pass the 250 MB a zip
# may hold unzipped. `sam build` builds it with the repository as its context. The package is laid
# out by the Makefile's build-SegmentsFunction, as the zip functions' are (wheels for Lambda's
# Python and CPU, the code the handlers reach), then copied onto AWS's base image.
FROM python:3.12-slim-bookworm AS package
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile ./
COPY lambdas ./lambdas
COPY ndstore ./ndstore
COPY blaze ./blaze
RUN make build-SegmentsFunction ARTIFACTS_DIR=/package LAMBDA_PIP="python -m pip --no-cache-dir"

FROM public.ecr.aws/lambda/python:3.12
COPY --from=package /package ${LAMBDA_TASK_ROOT}
CMD ["lambdas.segments.rebuild"]

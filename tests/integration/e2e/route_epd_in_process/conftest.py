"""Route -> Scheduler -> Encode -> Prefill(+decode) in one process over real gRPC, on the
session's vLLM producer: one deployment serves every module of this package."""

from tests.integration.e2e.route_epd_deployment import deployment_fixture

deployment = deployment_fixture("package")

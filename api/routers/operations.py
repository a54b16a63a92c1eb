"""Long-running operations: precompute every failure class up to k failures; progress, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from api.deps import JobDep, ServicesDep
from api.problems import Problem, ProblemDocument
from api.schemas import OperationOut, PrecomputeRequest
from api.solver import in_thread

router = APIRouter(tags=["operations"], responses={404: {"model": ProblemDocument},
                                                     422: {"model": ProblemDocument}})
OperationId = Annotated[str, Path(max_length=64)]


def operation_out(op: dict, eta_s: float | None) -> OperationOut:
    total = op["total"]
    return OperationOut(id=op["id"], job_id=op["job_id"], kind=op["kind"], status=op["status"],
                        max_failures=op["max_failures"], done=op["done"], total=total,
                        progress=round(op["done"] / total, 6) if total else 1.0, eta_s=eta_s,
                        error=op["error"], created_at=op["created_at"], updated_at=op["updated_at"])


@router.post("/v1/jobs/{job_id}/precompute", status_code=202, response_model=OperationOut)
async def start_precompute(body: PrecomputeRequest, job: JobDep, services: ServicesDep) -> JSONResponse:
    op = await services.precomputer.start(job, body.max_failures)
    doc = operation_out(op, None).model_dump(mode="json")
    return JSONResponse(doc, status_code=202, headers={"Location": f"/v1/operations/{op['id']}"})


async def _operation(operation_id: str, services) -> dict:
    op = await in_thread(services.store.get_operation, operation_id)
    if op is None:
        raise Problem(404, f"no operation {operation_id}", field="operation_id")
    return op


@router.get("/v1/operations/{operation_id}", response_model=OperationOut)
async def get_operation(operation_id: OperationId, services: ServicesDep) -> OperationOut:
    op = await _operation(operation_id, services)
    return operation_out(op, services.precomputer.eta_s(op))


@router.delete("/v1/operations/{operation_id}", response_model=OperationOut)
async def cancel_operation(operation_id: OperationId, services: ServicesDep) -> OperationOut:
    """Cancel a running precompute (plans already stored stay); a finished one is returned as is."""
    await _operation(operation_id, services)
    await services.precomputer.cancel(operation_id)
    return operation_out(await _operation(operation_id, services), None)

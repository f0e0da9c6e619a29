"""OpenAI's Files and Batches endpoints, for the server and the gateway alike.

    POST   /v1/files                   multipart: file (JSONL), purpose "batch"
    GET    /v1/files                   ?purpose= &limit= &after= &order=
    GET    /v1/files/{id}   DELETE /v1/files/{id}   GET /v1/files/{id}/content
    POST   /v1/batches                 input_file_id, endpoint, completion_window, metadata
    GET    /v1/batches                 ?limit= &after=
    GET    /v1/batches/{id}   POST /v1/batches/{id}/cancel

Everything belongs to the API key that made it (its bearer token's hash): another key gets a
404 for it and never sees it in a list.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from surge.batch import openapi as O
from surge.batch.config import ENDPOINTS, BatchConfig, parse_window
from surge.batch.errors import (
    BatchBadRequest,
    BatchLimitReached,
    BatchNotFound,
    BatchStorageFull,
    BatchTooLarge,
    BatchUnavailable,
)
from surge.batch.records import batch_object, file_object, owner_of, page
from surge.batch.service import BatchService
from surge.batch.store import AsyncStore, StorageError
from surge.batch.validate import UploadCheck, UploadRejected

router = APIRouter()
MULTIPART_OVERHEAD = 64 * 1024  # the form's own bytes around the file
COPY_CHUNK = 1024 * 1024


def _service(request: Request) -> tuple[BatchService, AsyncStore]:
    service: BatchService | None = getattr(request.app.state, "batch", None)
    if service is None:
        raise BatchUnavailable(
            "the Batch API is off on this server (--no-batch-api)", code="batch_api_off"
        )
    if service.astore is None:
        raise BatchUnavailable(f"the Batch API is unavailable: {service.error}", retry_after_s=60)
    return service, service.astore


def _owner(request: Request) -> str:
    return owner_of(request.headers.get("authorization"))


def _now() -> int:
    return int(time.time())


def _limit(request: Request, default: int, most: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise BatchBadRequest(f"limit must be an integer from 1 to {most}", param="limit")
    return value


async def _stored(astore: AsyncStore, fn: Any, *args: Any) -> Any:
    try:
        return await astore.call(fn, *args)
    except StorageError as e:
        raise BatchStorageFull(f"the batch store refused a write: {e}") from e


# ---- files ----------------------------------------------------------------------------------
async def _form(request: Request, config: BatchConfig) -> tuple[UploadFile, str]:
    """The upload's file and purpose; 413 past the file limit (counted as bytes arrive)."""
    kind = request.headers.get("content-type", "")
    if not kind.startswith("multipart/form-data"):
        raise BatchBadRequest(
            "upload the file as multipart/form-data with fields 'file' and 'purpose'",
            code="invalid_content_type",
        )
    limit = config.max_file_bytes + MULTIPART_OVERHEAD
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(config)

    async def counted() -> Any:
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                raise _too_large(config)
            yield chunk

    parser = MultiPartParser(request.headers, counted(), max_files=1, max_fields=8)
    try:
        form = await parser.parse()
    except MultiPartException as e:
        raise BatchBadRequest(f"bad multipart upload: {e.message}") from None
    upload, purpose = form.get("file"), form.get("purpose")
    if not isinstance(upload, UploadFile):
        raise BatchBadRequest("missing the 'file' field (a JSONL file)", param="file")
    if purpose != "batch":
        await upload.close()
        raise BatchBadRequest(
            f"purpose must be 'batch' (Surge's files are batch input), got {purpose!r}",
            param="purpose",
        )
    return upload, purpose


def _too_large(config: BatchConfig) -> BatchTooLarge:
    return BatchTooLarge(
        f"file is larger than the limit of {config.max_file_bytes} bytes "
        "(file bytes: --batch-max-file-bytes)"
    )


def _copy_checked(src: BinaryIO, dest: Path, config: BatchConfig) -> int:
    """Copy the upload into the data folder while checking it; its size."""
    check = UploadCheck(config)
    try:
        with dest.open("wb") as out:
            while chunk := src.read(COPY_CHUNK):
                check.feed(chunk)
                out.write(chunk)
            check.finish()
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return check.bytes


@router.post("/v1/files", responses=O.UPLOAD, openapi_extra=O.UPLOAD_BODY)
async def create_file(request: Request) -> JSONResponse:
    service, astore = _service(request)
    owner, config = _owner(request), service.config
    upload, purpose = await _form(request, config)
    try:
        files, used = await astore.call(astore.store.owner_usage, owner)
        if files >= config.max_files_per_key:
            raise BatchLimitReached(
                f"this API key keeps {files} files, the limit (--batch-max-files-per-key); "
                "delete some first",
                code="files_limit_reached",
                retry_after_s=60,
            )
        dest = astore.store.upload_path()
        try:
            nbytes = await asyncio.to_thread(_copy_checked, upload.file, dest, config)
        except UploadRejected as e:
            cls = BatchTooLarge if e.status == 413 else BatchBadRequest
            raise cls(str(e), code=e.code, param="file") from None
        except OSError as e:
            raise BatchStorageFull(f"the batch store cannot keep the file: {e}") from None
        if used + nbytes > config.max_bytes_per_key:
            dest.unlink(missing_ok=True)
            raise BatchLimitReached(
                f"this API key would keep {used + nbytes} bytes of files, over the limit of "
                f"{config.max_bytes_per_key} (--batch-max-bytes-per-key); delete some first",
                code="bytes_limit_reached",
                retry_after_s=60,
            )
        name = upload.filename or "upload.jsonl"
        row = await _stored(
            astore, astore.store.add_file, owner, name[:256], purpose, dest, nbytes, _now()
        )
    finally:
        await upload.close()
    return JSONResponse(file_object(row))


@router.get("/v1/files", responses=O.READ, openapi_extra=O.LIST_FILES)
async def list_files(request: Request) -> JSONResponse:
    _, astore = _service(request)
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BatchBadRequest("order must be 'asc' or 'desc'", param="order")
    rows, more = await astore.call(
        astore.store.list_files,
        _owner(request),
        q.get("after"),
        _limit(request, 10000, 10000),
        q.get("purpose"),
        order == "desc",
    )
    return JSONResponse(page([file_object(r) for r in rows], more))


async def _file(request: Request, file_id: str) -> Any:
    _, astore = _service(request)
    row = await astore.call(astore.store.get_file, _owner(request), file_id)
    if row is None:
        raise BatchNotFound(f"No such File object: {file_id}", param="file_id")
    return row


@router.get("/v1/files/{file_id}", responses=O.READ)
async def retrieve_file(request: Request, file_id: str) -> JSONResponse:
    return JSONResponse(file_object(await _file(request, file_id)))


@router.get("/v1/files/{file_id}/content", responses=O.CONTENT)
async def file_content(request: Request, file_id: str) -> FileResponse:
    row = await _file(request, file_id)
    service, _ = _service(request)
    assert service.astore is not None
    path = service.astore.store.file_path(row.id)
    if not path.exists():
        raise BatchNotFound(f"No such File object: {file_id}", param="file_id")
    return FileResponse(path, media_type="application/jsonl", filename=row.filename)


@router.delete("/v1/files/{file_id}", responses=O.WRITE)
async def delete_file(request: Request, file_id: str) -> JSONResponse:
    _, astore = _service(request)
    if not await _stored(astore, astore.store.delete_file, _owner(request), file_id):
        raise BatchNotFound(f"No such File object: {file_id}", param="file_id")
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


# ---- batches --------------------------------------------------------------------------------
def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    ok = (
        isinstance(value, dict)
        and len(value) <= 16
        and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in value.items()
        )
    )
    if not ok:
        raise BatchBadRequest(
            "metadata must be an object of at most 16 string values (keys up "
            "to 64 characters, values up to 512)",
            param="metadata",
        )
    return dict(value)


@router.post("/v1/batches", responses=O.CREATE, openapi_extra=O.BATCH_BODY)
async def create_batch(request: Request) -> JSONResponse:
    service, astore = _service(request)
    try:
        body = json.loads(await request.body())
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise BatchBadRequest("the body must be a JSON object")
    for name in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(name), str):
            raise BatchBadRequest(f"{name} is required (a string)", param=name)
    endpoint, window = body["endpoint"], body["completion_window"]
    if endpoint not in ENDPOINTS:
        raise BatchBadRequest(
            f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}", param="endpoint"
        )
    try:
        window_s = parse_window(window)
    except ValueError as e:
        raise BatchBadRequest(str(e), param="completion_window") from None
    metadata = _metadata(body.get("metadata"))
    owner = _owner(request)
    row = await astore.call(astore.store.get_file, owner, body["input_file_id"])
    if row is None:
        raise BatchNotFound(f"No such File object: {body['input_file_id']}", param="input_file_id")
    if row.purpose != "batch":
        raise BatchBadRequest(
            f"file {row.id} has purpose {row.purpose!r}, not 'batch'", param="input_file_id"
        )
    active = await astore.call(astore.store.count_active, owner)
    if active >= service.config.max_batches_per_key:
        raise BatchLimitReached(
            f"this API key has {active} batches in flight, the limit "
            "(--batch-max-batches-per-key); wait for one to end or cancel one",
            code="batches_limit_reached",
            retry_after_s=60,
        )
    batch = await _stored(
        astore,
        astore.store.create_batch,
        owner,
        request.headers.get("authorization"),
        endpoint,
        row.id,
        window.strip(),
        window_s,
        metadata,
        _now(),
    )
    service.poke()
    return JSONResponse(batch_object(batch))


@router.get("/v1/batches", responses=O.READ, openapi_extra=O.LIST_BATCHES)
async def list_batches(request: Request) -> JSONResponse:
    _, astore = _service(request)
    rows, more = await astore.call(
        astore.store.list_batches,
        _owner(request),
        request.query_params.get("after"),
        _limit(request, 20, 100),
    )
    return JSONResponse(page([batch_object(b) for b in rows], more))


@router.get("/v1/batches/{batch_id}", responses=O.READ)
async def retrieve_batch(request: Request, batch_id: str) -> JSONResponse:
    _, astore = _service(request)
    batch = await astore.call(astore.store.get_batch, _owner(request), batch_id)
    if batch is None:
        raise BatchNotFound(f"No such Batch object: {batch_id}", param="batch_id")
    return JSONResponse(batch_object(batch))


@router.post("/v1/batches/{batch_id}/cancel", responses=O.WRITE)
async def cancel_batch(request: Request, batch_id: str) -> JSONResponse:
    service, astore = _service(request)
    batch = await _stored(astore, astore.store.request_cancel, _owner(request), batch_id, _now())
    if batch is None:
        raise BatchNotFound(f"No such Batch object: {batch_id}", param="batch_id")
    service.poke()
    return JSONResponse(batch_object(batch))

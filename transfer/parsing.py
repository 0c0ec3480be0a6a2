"""Reading a kin document from bytes (an upload, a file): the API's JSON rules (size cap,
nesting depth, no NUL characters) for the dashboard form and `manage.py import_kin` too,
so every way in refuses exactly the same documents."""
from rest_framework.exceptions import APIException

from kinsite.api.parsers import JSONParser, RequestTooLarge
from kinsite.errors import KinsiteError
from transfer.services import DocumentInvalid


class KinDocumentParser(JSONParser):
    """The API's JSON parser with the kin document's own size cap: a kin with its sessions
    is far larger than any other request body."""

    limit_setting = "TRANSFER_MAX_DOCUMENT_BYTES"


class DocumentTooLarge(KinsiteError):
    code = "request_too_large"
    status = 413


def document_read(stream) -> object:
    """The parsed JSON of `stream` (a binary file); DocumentTooLarge over
    TRANSFER_MAX_DOCUMENT_BYTES, DocumentInvalid when it is not JSON Kinsite can store."""
    try:
        return KinDocumentParser().parse(stream, "application/json", {})
    except RequestTooLarge as exc:
        raise DocumentTooLarge(str(exc.detail)) from None
    except APIException as exc:
        message = str(exc.detail)
        raise DocumentInvalid(f"The file is not a readable kin document: {message}",
                              details={"errors": [{"path": "$", "message": message}]}) from None

"""A model server that never really speaks, for the tier's own test (run as a script).

``python tests/real_llm/stub_server.py MODE URL_FILE`` serves the scripted
OpenAI-compatible endpoint on a free port, writes its base URL to ``URL_FILE`` and
serves until killed. Every chat completion is answered per MODE:

* ``crash``: the process kills itself with SIGSEGV (a llama.cpp build for another CPU);
* ``500``: an HTTP 500;
* ``close``: the connection is closed without an answer;
* ``useless``: a 200 whose content is ``{"scenes": []}`` (the model "speaks", but
  never a memory nor a reflection).
"""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path
from typing import Any

from memstream.bench.openai_fake import OpenAICompatServer, Reply


def responder(mode: str):  # type: ignore[no-untyped-def]
    def answer(body: dict[str, Any]) -> Reply:
        if mode == "crash":
            ctypes.string_at(0)  # a real segmentation fault, as a native library would
        if mode == "500":
            return Reply(status=500, error_message="internal error")
        if mode == "close":
            return Reply(drop=True)
        return Reply(json_value={"scenes": []})

    return answer


def main(mode: str, url_file: str) -> None:
    server = OpenAICompatServer().start()
    server.chat.responder = responder(mode)
    Path(url_file).write_text(server.base_url)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

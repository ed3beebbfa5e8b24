"""kiln.logs.captured: an artifact's messages collected for a block, the logs on before restored."""

import logging

from kiln import logs


def test_captured_collects_the_block_and_restores_the_logs_on_before():
    logs.set_logs("graph")
    try:
        handlers = list(logging.getLogger("kiln").handlers)
        with logs.captured("perf_hints") as buf:
            logs.log("perf_hints", "inside the block")
            logs.log("graph", "graph is off inside")
            assert logs.enabled_artifacts() == {"perf_hints"}
        logs.log("perf_hints", "after the block")
        assert buf.getvalue() == "inside the block\n"
        assert logs.enabled_artifacts() == {"graph"}
        assert logging.getLogger("kiln").handlers == handlers
    finally:
        logs.set_logs()

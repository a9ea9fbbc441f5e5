"""An OTLP/gRPC trace receiver for weir's tracing tests (controller/tests/tracing.rs).

It serves opentelemetry.proto.collector.trace.v1.TraceService/Export with the service
definitions and messages of the PyPI package `opentelemetry-proto` on grpcio, on a loopback
port the OS picks, and prints:

    listening port=PORT                      once serving
    {"trace_id": ..., ...}                   one JSON line per span received

With --stall SECONDS every export waits that long before it answers (a slow collector).
"""

import argparse
import json
import sys
import threading
import time
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

LOCK = threading.Lock()


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, stall):
        self.stall = stall

    def Export(self, request, context):
        if self.stall:
            time.sleep(self.stall)
        for rs in request.resource_spans:
            resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for span in ss.spans:
                    line = {
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "trace_state": span.trace_state,
                        "name": span.name,
                        "kind": span.kind,
                        "flags": span.flags,
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "status_code": span.status.code,
                        "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                        "resource": resource,
                        "scope": ss.scope.name,
                    }
                    with LOCK:
                        print(json.dumps(line), flush=True)
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stall", type=float, default=0)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(args.stall), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening port={port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    sys.exit(main())

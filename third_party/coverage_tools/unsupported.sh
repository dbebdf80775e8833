#!/bin/sh
echo "bazel coverage is unsupported in this offline build" >&2
exit 1

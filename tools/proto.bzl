"""cc_grpc_proto: C++ protobuf + gRPC code from one .proto with Debian's protoc and plugin."""

def cc_grpc_proto(name, src, deps = [], visibility = None):
    """Generates <src>.pb.{h,cc} and <src>.grpc.pb.{h,cc} and a cc_library over them."""
    base = src[:-len(".proto")]
    outs = [base + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        cmd = ("/usr/bin/protoc --proto_path=. --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin $(location %s)") % src,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc", base + ".grpc.pb.cc"],
        hdrs = [base + ".pb.h", base + ".grpc.pb.h"],
        deps = deps + ["//third_party:grpc"],
        visibility = visibility,
    )

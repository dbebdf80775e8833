#include "worker/comm/allreduce_group.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_builder.h"

namespace dptrain {

absl::StatusOr<std::unique_ptr<AllReduceGroup>> AllReduceGroup::Listen(
    const AllReduceGroupOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " not in [0, ", o.world_size, ")"));
  }
  if (o.rank != 0 && (o.master_port < 1 || o.master_port > 65535)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " needs --master_port (rank 0's port), got ", o.master_port));
  }
  std::unique_ptr<AllReduceGroup> group(new AllReduceGroup());
  group->options_ = o;
  std::string host = o.advertise_host;
  if (host.empty()) {
    auto local = LocalAddressToward(o.master_addr);
    if (!local.ok()) return local.status();
    host = *local;
  }
  auto listener = TcpListener::Listen(0, o.bind_address);
  if (!listener.ok()) return listener.status();
  group->listener_ = *std::move(listener);
  if (o.rank == 0) {
    group->table_ = std::make_unique<RendezvousTable>(o.job_id, o.world_size);
    group->rendezvous_service_ =
        std::make_unique<RendezvousService>(group->table_.get(), o.connect_timeout);
    if (auto s = CheckCanListen(absl::StrCat(o.bind_address, ":", o.master_port)); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("rank 0: master port: ", s.message()));
    }
    grpc::ServerBuilder builder;
    ConfigureServerBuilder(builder);
    builder.AddListeningPort(absl::StrCat(o.bind_address, ":", o.master_port),
                             o.credentials->ServerCredentials(), &group->port_);
    builder.RegisterService(group->rendezvous_service_.get());
    group->server_ = builder.BuildAndStart();
    if (group->server_ == nullptr || group->port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("rank 0: cannot listen on master port ", o.master_port));
    }
  }
  group->address_ = absl::StrCat(host, ":", group->listener_->port());
  return group;
}

AllReduceGroup::~AllReduceGroup() {
  link_.reset();
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

absl::Status AllReduceGroup::Join() {
  const AllReduceGroupOptions& o = options_;
  const absl::Time deadline = absl::Now() + o.connect_timeout;
  std::vector<std::string> addresses;
  if (o.rank == 0) {
    auto all = table_->Join(o.job_id, 0, o.world_size, address_, deadline);
    if (!all.ok()) return all.status();
    addresses = *std::move(all);
  } else {
    const std::string master = absl::StrCat(o.master_addr, ":", o.master_port);
    auto channel = MakeChannel(master, *o.credentials);
    if (!channel->WaitForConnected(absl::ToChronoTime(deadline))) {
      return absl::UnavailableError(absl::StrCat("cannot reach rank 0 at ", master, " within ",
                                                 absl::FormatDuration(o.connect_timeout)));
    }
    auto stub = proto::Rendezvous::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline + absl::Seconds(5)));
    proto::JoinRequest request;
    request.set_job_id(o.job_id);
    request.set_rank(o.rank);
    request.set_world_size(o.world_size);
    request.set_address(address_);
    proto::JoinResponse response;
    grpc::Status status = stub->Join(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status, absl::StrCat("rendezvous at ", master));
    addresses.assign(response.addresses().begin(), response.addresses().end());
    if (static_cast<int>(addresses.size()) != o.world_size) {
      return absl::DataLossError("rendezvous answered with the wrong number of ranks");
    }
  }
  TcpPeerLinkOptions link_options;
  link_options.job_id = o.job_id;
  link_options.rank = o.rank;
  link_options.addresses = std::move(addresses);
  link_options.timeout = o.timeout;
  link_options.max_message_bytes = o.max_message_bytes;
  link_options.job_token = o.credentials->job_token();
  auto link = TcpPeerLink::Create(link_options, std::move(listener_));
  if (!link.ok()) return link.status();
  link_ = *std::move(link);
  return absl::OkStatus();
}

}  // namespace dptrain

#define BOOST_TEST_MODULE integration_domain_xml
#include <boost/test/unit_test.hpp>

#include <string>

#include "vrdma/integration/domain_xml.hpp"

using namespace vrdma::integration;

namespace {

std::string domain(const std::string& device_attrs, const std::string& socket = "/run/vrdma/g1.sock") {
  return "<domain type='qemu'><name>g1</name><memory unit='MiB'>256</memory>"
         "<metadata><other:x xmlns:other='https://example.org/other'/>"
         "<vrdma:device xmlns:vrdma='https://vrdma.dev/xmlns/1' " +
         device_attrs +
         "/></metadata>"
         "<devices><disk type='vhostuser' device='disk'><driver name='qemu' type='raw'/>"
         "<source type='unix' path='" +
         socket +
         "'><reconnect enabled='yes' timeout='1'/></source><target dev='vda' bus='virtio'/></disk>"
         "<serial type='file'><source path='/var/log/g1.console'/></serial></devices></domain>";
}

const std::string kFull =
    "socket='/run/vrdma/g1.sock' engine='soft:10.0.0.5' mac='52:54:00:12:34:56' announce='eth0' "
    "incoming='tcp:10.99.9.2:7811'";

}  // namespace

BOOST_AUTO_TEST_CASE(a_domain_without_the_element_is_left_alone) {
  auto d = parse_domain("<domain type='qemu'><name>plain</name><metadata><a:b xmlns:a='urn:x'/></metadata></domain>");
  BOOST_REQUIRE(d.ok());
  BOOST_TEST(d->name == "plain");
  BOOST_TEST(!d->device.has_value());
  // Same local name in another namespace is not ours either.
  auto other = parse_domain(
      "<domain><name>o</name><metadata><v:device xmlns:v='https://example.org/v' socket='/x'/></metadata></domain>");
  BOOST_REQUIRE(other.ok());
  BOOST_TEST(!other->device.has_value());
}

BOOST_AUTO_TEST_CASE(every_attribute_is_read) {
  auto d = parse_domain(domain(kFull));
  BOOST_REQUIRE(d.ok());
  BOOST_REQUIRE(d->device.has_value());
  const auto& m = *d->device;
  BOOST_TEST((m.backend == BackendKind::vrdmad));
  BOOST_TEST(m.socket == "/run/vrdma/g1.sock");
  BOOST_TEST(m.engine == "soft:10.0.0.5");
  BOOST_TEST(m.mac == "52:54:00:12:34:56");
  BOOST_TEST(m.announce == "eth0");
  BOOST_TEST(m.incoming == "tcp:10.99.9.2:7811");
  BOOST_TEST(m.control == "/run/vrdma/g1.ctl");  // default: next to the socket, named after the domain
}

BOOST_AUTO_TEST_CASE(migration_port_is_short_for_incoming_on_every_address) {
  auto d = parse_domain(domain("socket='/run/vrdma/g1.sock' engine='soft:10.0.0.5' migration-port='7811'"));
  BOOST_REQUIRE(d.ok());
  BOOST_TEST(d->device->incoming == "tcp:0.0.0.0:7811");
}

BOOST_AUTO_TEST_CASE(incomplete_or_wrong_elements_are_refused_with_the_attribute_named) {
  auto no_engine = parse_domain(domain("socket='/run/vrdma/g1.sock' incoming='tcp:1.2.3.4:5'"));
  BOOST_REQUIRE(!no_engine.ok());
  BOOST_TEST(no_engine.error().message.find("engine") != std::string::npos);
  // Without a stream address a destination takes the state from the guest's memory.
  auto no_incoming = parse_domain(domain("socket='/run/vrdma/g1.sock' engine='soft:1.2.3.4'"));
  BOOST_REQUIRE(no_incoming.ok());
  BOOST_TEST(no_incoming->device->incoming == "guest");
  auto relative = parse_domain(domain("socket='g1.sock' engine='soft:1.2.3.4' incoming='tcp:1.2.3.4:5'"));
  BOOST_REQUIRE(!relative.ok());
  BOOST_TEST(relative.error().message.find("socket") != std::string::npos);
  auto bad_incoming = parse_domain(domain("socket='/s' engine='soft:1.2.3.4' incoming='udp:1.2.3.4:x'"));
  BOOST_REQUIRE(!bad_incoming.ok());
  BOOST_TEST(bad_incoming.error().message.find("tcp:IP:PORT") != std::string::npos);
  auto bad_port = parse_domain(domain("socket='/s' engine='soft:1.2.3.4' migration-port='70000'"));
  BOOST_REQUIRE(!bad_port.ok());
  auto bad_backend = parse_domain(domain("backend='nope' socket='/s'"));
  BOOST_REQUIRE(!bad_backend.ok());
  BOOST_TEST(bad_backend.error().message.find("nope") != std::string::npos);
  auto blk_no_disk = parse_domain(domain("backend='vhost-user-blk' socket='/s'"));
  BOOST_REQUIRE(!blk_no_disk.ok());
  BOOST_TEST(blk_no_disk.error().message.find("disk") != std::string::npos);
  BOOST_TEST(!parse_domain("<domain><name>x</name>").ok());
  BOOST_TEST(!parse_domain("<network/>").ok());
}

BOOST_AUTO_TEST_CASE(decimal_in_takes_whole_decimal_numbers_in_range_only) {
  BOOST_TEST(decimal_in("1", 1, 10).value_or(0) == 1u);
  BOOST_TEST(decimal_in("10", 1, 10).value_or(0) == 10u);
  BOOST_TEST(!decimal_in("11", 1, 10));
  BOOST_TEST(!decimal_in("0", 1, 10));
  BOOST_TEST(!decimal_in("", 0, 10));
  BOOST_TEST(!decimal_in("-1", 0, 10));
  BOOST_TEST(!decimal_in("5 ", 0, 10));
  BOOST_TEST(!decimal_in("0x5", 0, 10));
  BOOST_TEST(!decimal_in("99999999999999999999999", 0, ~0ul));
}

BOOST_AUTO_TEST_CASE(per_host_names_do_not_collide) {
  auto d = parse_domain(domain(kFull));
  BOOST_REQUIRE(d.ok());
  const auto a = for_host(*d, "lv9-a");
  const auto b = for_host(*d, "lv9-b");
  BOOST_TEST(a.socket == "/run/vrdma/g1.lv9-a.sock");
  BOOST_TEST(a.control == "/run/vrdma/g1.lv9-a.ctl");
  BOOST_TEST(b.socket == "/run/vrdma/g1.lv9-b.sock");
  BOOST_TEST(a.incoming == d->device->incoming);
  // A guest that comes back: from b's name to a's, not a's name with another suffix.
  auto back = parse_domain(domain(kFull, b.socket));
  BOOST_REQUIRE(back.ok());
}

BOOST_AUTO_TEST_CASE(rewrite_replaces_the_device_source_and_the_element_only) {
  const auto xml = domain(kFull);
  auto d = parse_domain(xml);
  BOOST_REQUIRE(d.ok());
  const auto here = for_host(*d, "lv9-b");
  auto out = rewrite_sockets(xml, *d->device, here);
  BOOST_REQUIRE(out.ok());
  BOOST_TEST(out->find("path=\"/run/vrdma/g1.lv9-b.sock\"") != std::string::npos);
  BOOST_TEST(out->find("/run/vrdma/g1.sock") == std::string::npos);
  BOOST_TEST(out->find("/var/log/g1.console") != std::string::npos);       // other sources untouched
  BOOST_TEST(out->find("https://example.org/other") != std::string::npos);  // other metadata kept
  BOOST_TEST(out->find("<reconnect") != std::string::npos);
  // The printed XML parses again, with the new names, and rewriting it back gives the old names.
  auto again = parse_domain(*out);
  BOOST_REQUIRE(again.ok());
  BOOST_TEST(again->device->socket == here.socket);
  BOOST_TEST(again->device->control == here.control);
  BOOST_TEST(again->device->engine == "soft:10.0.0.5");
  auto back = rewrite_sockets(*out, here, *d->device);
  BOOST_REQUIRE(back.ok());
  BOOST_TEST(back->find("path=\"/run/vrdma/g1.sock\"") != std::string::npos);
  BOOST_TEST(!rewrite_sockets("not xml", here, *d->device).ok());
}

namespace {
const std::string kPlain =
    "<domain type='qemu'><name>g1</name><memory unit='MiB'>256</memory><os><type>hvm</type></os>"
    "<devices><disk type='file' device='disk'><source file='/x.img'/><target dev='vda' bus='virtio'/></disk></devices>"
    "</domain>";

AttachOptions attach_opts() {
  AttachOptions o;
  o.device.socket = "/run/vrdma/g1.sock";
  o.device.engine = "soft:10.0.0.5";
  o.device.mac = "52:54:00:12:34:56";
  o.device.incoming = "tcp:0.0.0.0:7811";
  return o;
}
}  // namespace

BOOST_AUTO_TEST_CASE(attach_adds_the_carrier_disk_shared_memory_and_the_metadata) {
  auto x = attach_device(kPlain, attach_opts());
  BOOST_REQUIRE_MESSAGE(x.ok(), (x.ok() ? "" : x.error().message));
  BOOST_TEST(x->find("<disk type=\"vhostuser\" device=\"disk\">") != std::string::npos);
  BOOST_TEST(x->find("<source type=\"unix\" path=\"/run/vrdma/g1.sock\">") != std::string::npos);
  BOOST_TEST(x->find("<target dev=\"vdb\" bus=\"virtio\"/>") != std::string::npos);  // vda is taken
  BOOST_TEST(x->find("queues=\"") != std::string::npos);
  BOOST_TEST(x->find("<source type=\"memfd\"/>") != std::string::npos);
  BOOST_TEST(x->find("<access mode=\"shared\"/>") != std::string::npos);
  // The hook reads back exactly what was asked for.
  auto d = parse_domain(*x);
  BOOST_REQUIRE(d.ok());
  BOOST_REQUIRE(d->device.has_value());
  BOOST_TEST(d->device->socket == "/run/vrdma/g1.sock");
  BOOST_TEST(d->device->engine == "soft:10.0.0.5");
  BOOST_TEST(d->device->mac == "52:54:00:12:34:56");
  BOOST_TEST(d->device->incoming == "tcp:0.0.0.0:7811");
}

// poll-us: vrdmad's latency mode, asked for per domain; written by attach, read by the hook.
BOOST_AUTO_TEST_CASE(poll_us_is_read_checked_and_written_back) {
  BOOST_TEST(parse_domain(domain(kFull))->device->poll_us == 0u);  // absent: vrdmad sleeps on kicks
  auto d = parse_domain(domain("socket='/s' engine='soft:1.2.3.4' poll-us='200'"));
  BOOST_REQUIRE(d.ok());
  BOOST_TEST(d->device->poll_us == 200u);
  for (const char* bad : {"0", "-5", "12x", "2000000", " 7", "+7"}) {
    auto b = parse_domain(domain(std::string("socket='/s' engine='soft:1.2.3.4' poll-us='") + bad + "'"));
    BOOST_REQUIRE_MESSAGE(!b.ok(), "poll-us '" << bad << "' was taken");
    BOOST_TEST(b.error().message.find("poll-us") != std::string::npos, b.error().message);
    BOOST_TEST(b.error().message.find("1..1000000") != std::string::npos, b.error().message);
  }
  AttachOptions o;
  o.device.socket = "/run/vrdma/g1.sock";
  o.device.engine = "soft:10.0.0.5";
  o.device.poll_us = 150;
  auto x = attach_device(kPlain, o);
  BOOST_REQUIRE(x.ok());
  BOOST_TEST(x->find("poll-us=\"150\"") != std::string::npos);
  BOOST_TEST(parse_domain(*x)->device->poll_us == 150u);
}

// notices: the guest's addresses for peer notices on a NIC (vrdmad --notices): IPv4, global
// IPv6, or both.
BOOST_AUTO_TEST_CASE(notices_is_read_checked_and_written_back) {
  BOOST_TEST(parse_domain(domain(kFull))->device->notices.empty());
  auto d = parse_domain(domain("socket='/s' engine='verbs:mlx5_0' notices='10.0.0.5'"));
  BOOST_REQUIRE(d.ok());
  BOOST_TEST(d->device->notices == "10.0.0.5");
  for (const char* good : {"fd00::5", "10.0.0.5,fd00::5", "2001:db8::7"}) {
    auto g = parse_domain(domain(std::string("socket='/s' engine='verbs:mlx5_0' notices='") + good + "'"));
    BOOST_REQUIRE_MESSAGE(g.ok(), "notices '" << good << "': " << (g.ok() ? std::string() : g.error().message));
    BOOST_TEST(g->device->notices == good);
  }
  for (const char* bad : {"10.0.0", "10.0.0.256", "host", "fe80::1", " 10.0.0.5", "10.0.0.5,", ",10.0.0.5", "::1", "ff02::1"}) {
    auto b = parse_domain(domain(std::string("socket='/s' engine='verbs:mlx5_0' notices='") + bad + "'"));
    BOOST_REQUIRE_MESSAGE(!b.ok(), "notices '" << bad << "' was taken");
    BOOST_TEST(b.error().message.find("IPv4 or global IPv6") != std::string::npos, b.error().message);
  }
  AttachOptions o;
  o.device.socket = "/run/vrdma/g1.sock";
  o.device.engine = "verbs:mlx5_0";
  o.device.notices = "10.0.0.5";
  auto x = attach_device(kPlain, o);
  BOOST_REQUIRE(x.ok());
  BOOST_TEST(x->find("notices=\"10.0.0.5\"") != std::string::npos);
  BOOST_TEST(parse_domain(*x)->device->notices == "10.0.0.5");
  o.device.notices = "10.0.0.x";
  BOOST_TEST(!attach_device(kPlain, o).ok());
}

BOOST_AUTO_TEST_CASE(attach_keeps_hugepages_and_makes_them_shared) {
  const std::string huge =
      "<domain type='kvm'><name>h</name><memoryBacking><hugepages/><access mode='private'/></memoryBacking>"
      "<devices/></domain>";
  auto x = attach_device(huge, attach_opts());
  BOOST_REQUIRE(x.ok());
  BOOST_TEST(x->find("<hugepages/>") != std::string::npos);
  BOOST_TEST(x->find("memfd") == std::string::npos);
  BOOST_TEST(x->find("<access mode=\"shared\"/>") != std::string::npos);
  BOOST_TEST(x->find("private") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(attach_refuses_what_would_clash_with_sentences) {
  auto o = attach_opts();
  auto twice = attach_device(attach_device(kPlain, o).value(), o);
  BOOST_REQUIRE(!twice.ok());
  BOOST_TEST(twice.error().message.find("already has a vrdma:device") != std::string::npos);

  auto taken = o;
  taken.target = "vda";
  auto t = attach_device(kPlain, taken);
  BOOST_REQUIRE(!t.ok());
  BOOST_TEST(t.error().message.find("already has a disk vda") != std::string::npos);

  auto no_engine = o;
  no_engine.device.engine.clear();
  BOOST_TEST(attach_device(kPlain, no_engine).error().message.find("engine") != std::string::npos);
  auto relative = o;
  relative.device.socket = "g1.sock";
  BOOST_TEST(attach_device(kPlain, relative).error().message.find("absolute") != std::string::npos);
  BOOST_TEST(!attach_device("<domain><name>x</name>", o).ok());
  BOOST_TEST(attach_device("<network/>", o).error().message.find("not a <domain>") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(engine_verbs_vf_reads_the_vf_attributes) {
  auto d = parse_domain(domain("socket='/run/vrdma/g1.sock' engine='verbs:vf' mac='52:54:00:12:34:56' vf-pool='ens1f0' "
                               "vf-numa='1' vf-vlan='42' vf-max-rate='10000' vf-trust='on' vf-spoofchk='off'"));
  BOOST_REQUIRE_MESSAGE(d.ok(), (d.ok() ? "" : d.error().message));
  BOOST_REQUIRE(d->device->vf.has_value());
  const VfRequest& v = *d->device->vf;
  BOOST_TEST(v.pool == "ens1f0");
  BOOST_TEST(v.numa_node.value() == 1);
  BOOST_TEST(v.vlan.value() == 42);
  BOOST_TEST(v.max_rate_mbps.value() == 10000U);
  BOOST_TEST(v.trust.value());
  BOOST_TEST(!v.spoofchk.value());
  // Options after '?' are the verbs provider's; a bare verbs:vf takes any PF.
  auto any = parse_domain(domain("socket='/s' engine='verbs:vf?gid_index=3'"));
  BOOST_REQUIRE(any.ok());
  BOOST_TEST((any->device->vf == VfRequest{}));
  // Other engines carry no VF request.
  BOOST_TEST(!parse_domain(domain(kFull))->device->vf.has_value());
  BOOST_TEST(!is_vf_engine("verbs:vfx"));
  BOOST_TEST(is_vf_engine("verbs:vf"));
}

BOOST_AUTO_TEST_CASE(wrong_vf_attributes_are_refused_with_the_attribute_named) {
  auto msg = [](const std::string& attrs) {
    auto d = parse_domain(domain("socket='/s' " + attrs));
    return d.ok() ? std::string("accepted") : d.error().message;
  };
  BOOST_TEST(msg("engine='verbs:vf' vf-vlan='4095'").find("vf-vlan \"4095\"; it must be a VLAN id, 0..4094") !=
             std::string::npos);
  BOOST_TEST(msg("engine='verbs:vf' vf-trust='maybe'").find("vf-trust \"maybe\"; it must be on or off") !=
             std::string::npos);
  BOOST_TEST(msg("engine='verbs:vf' vf-pool='a/b'").find("vf-pool") != std::string::npos);
  BOOST_TEST(msg("engine='verbs:vf' vf-numa='-1'").find("vf-numa") != std::string::npos);
  BOOST_TEST(msg("engine='soft:10.0.0.5' vf-pool='ens1f0'").find("apply only to engine=\"verbs:vf\"") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(attach_writes_the_vf_request_the_hook_reads_back) {
  AttachOptions o;
  o.device.socket = "/run/vrdma/g1.sock";
  o.device.engine = "verbs:vf";
  o.device.mac = "52:54:00:12:34:56";
  o.device.vf = VfRequest{"0000:3b:00.0", std::nullopt, 100, 0, std::nullopt, true};
  auto x = attach_device(kPlain, o);
  BOOST_REQUIRE_MESSAGE(x.ok(), (x.ok() ? "" : x.error().message));
  BOOST_TEST(x->find("vf-pool=\"0000:3b:00.0\"") != std::string::npos);
  auto d = parse_domain(*x);
  BOOST_REQUIRE(d.ok());
  BOOST_TEST((d->device->vf == o.device.vf));
  auto soft = o;
  soft.device.engine = "soft:10.0.0.5";
  BOOST_TEST(attach_device(kPlain, soft).error().message.find("need the engine verbs:vf") != std::string::npos);
}

// Hot-plug: a running domain needs shared memory from boot; the parts libvirt gets are the
// carrier disk alone and the metadata element without a namespace of its own (libvirt adds it),
// and reading them back gives the same device; detach finds the same parts in the domain's XML.
BOOST_AUTO_TEST_CASE(live_parts_need_shared_memory_and_are_the_disk_and_the_bare_metadata) {
  auto refused = live_attach_parts(kPlain, attach_opts());
  BOOST_REQUIRE(!refused.ok());
  BOOST_TEST(refused.error().message.find("not shared") != std::string::npos, refused.error().message);
  std::string shared = kPlain;
  shared.replace(shared.find("<os>"), 0, "<memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>");
  auto p = live_attach_parts(shared, attach_opts());
  BOOST_REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().message));
  BOOST_TEST(p->disk.rfind("<disk type=\"vhostuser\" device=\"disk\">", 0) == 0, p->disk);
  BOOST_TEST(p->disk.find("/run/vrdma/g1.sock") != std::string::npos);
  BOOST_TEST(p->disk.find("/x.img") == std::string::npos);  // the domain's own disk is not in it
  BOOST_TEST(p->metadata.rfind("<device ", 0) == 0, p->metadata);
  BOOST_TEST(p->metadata.find("xmlns") == std::string::npos, p->metadata);
  BOOST_TEST(p->metadata.find("engine=\"soft:10.0.0.5\"") != std::string::npos, p->metadata);
  BOOST_TEST(p->device.socket == "/run/vrdma/g1.sock");
  BOOST_TEST(p->device.domain == "g1");
  // The domain's XML as libvirt shows it after the hot-plug: the same parts come back out.
  auto attached = attach_device(shared, attach_opts());
  BOOST_REQUIRE(attached.ok());
  auto d = live_detach_parts(*attached);
  BOOST_REQUIRE_MESSAGE(d.ok(), (d.ok() ? "" : d.error().message));
  BOOST_TEST(d->disk == p->disk);
  BOOST_TEST(d->device.engine == "soft:10.0.0.5");
  BOOST_TEST(has_carrier_disk(*attached, "/run/vrdma/g1.sock"));
  BOOST_TEST(!has_carrier_disk(shared, "/run/vrdma/g1.sock"));
  BOOST_TEST(!has_carrier_disk("<domain", "/run/vrdma/g1.sock"));
  auto none = live_detach_parts(shared);
  BOOST_REQUIRE(!none.ok());
  BOOST_TEST(none.error().message.find("has no vrdma device") != std::string::npos, none.error().message);
}

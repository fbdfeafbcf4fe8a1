use super::*;

#[test]
fn the_namespace_is_routed_nowhere_before_it_gets_a_way_out() {
    let batch = configuration(&["192.0.2.2".parse().expect("ip")]);
    let at = |line: &str| {
        batch
            .lines()
            .position(|l| l == line)
            .unwrap_or_else(|| panic!("{line:?} not in {batch}"))
    };
    let up = at("link set tap0 mtu 65520 up");
    assert!(at("route replace prohibit 169.254.0.0/16") < up);
    assert!(at("route replace prohibit 192.0.2.2/32") < up, "the host's own address");
    assert!(at("route add default via 10.0.2.2 dev tap0") < at("route replace prohibit 10.0.2.2/32"));
    assert!(!batch.contains(" lo"), "bubblewrap sets up lo, alone");
}

#[test]
fn the_blocked_ranges_cover_metadata_private_and_loopback_addresses() {
    let nets: Vec<(Ipv4Addr, u32)> = BLOCKED
        .iter()
        .map(|r| {
            let (ip, len) = r.split_once('/').expect("a prefix");
            (ip.parse().expect("an address"), len.parse().expect("a length"))
        })
        .collect();
    let blocked = |ip: Ipv4Addr| {
        nets.iter().any(|(net, len)| {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(ip) & mask == u32::from(*net) & mask
        })
    };
    for ip in [
        "169.254.169.254",
        "100.100.100.200",
        "192.0.0.192",
        "10.1.2.3",
        "172.17.0.1",
        "192.168.1.1",
        "100.64.0.1",
    ] {
        assert!(blocked(ip.parse().expect("ip")), "{ip}");
    }
    for ip in ["1.1.1.1", "151.101.1.1", "172.32.0.1", "10.0.2.3"] {
        let ip: Ipv4Addr = ip.parse().expect("ip");
        // 10.0.2.3 is slirp4netns's resolver: routed on its device, a longer prefix than 10/8.
        assert_eq!(blocked(ip), ip.octets()[0] == 10, "{ip}");
    }
}

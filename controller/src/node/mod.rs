//! `weir node`: the in-tree kube-proxy for Service ClusterIP L4 (iptables, ipvs, nftables).

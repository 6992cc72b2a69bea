"""shoal's test control plane: a real kube-apiserver and friends, kwok nodes
with GPUs, and a pod runner that plays kubelet with local processes."""

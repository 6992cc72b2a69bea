#!/usr/bin/env bash
# make demo: what works today, end to end, on a local default.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/hack"
py=.venv/bin/python
dir="$(mktemp -d /tmp/shoal-demo.XXXXXX)"
trap '$py -m shoal_testbed down --dir "$dir" >/dev/null; rm -rf "$dir"' EXIT

echo "== starting a real control plane (etcd, kube-apiserver, controllers, scheduler, kwok)"
$py -m shoal_testbed up --dir "$dir"
kubectl=".testbed/bin/kubectl --kubeconfig=$dir/kubeconfig"
echo
echo "== nodes: fake GPU nodes advertising nvidia.com/gpu"
$kubectl get nodes -L nvidia.com/gpu.product -o custom-columns='NAME:.metadata.name,GPUS:.status.allocatable.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product,POD-CIDR:.spec.podCIDR'
echo
echo "== a pod run by the pod runner, answering at its pod IP"
$kubectl run hello --image=python:3.11 --annotations=testbed.shoal.dev/run=hello \
  --overrides='{"spec":{"containers":[{"name":"hello","image":"python:3.11","command":["python3","-m","http.server","--bind","$(POD_IP)","8080"],"env":[{"name":"POD_IP","valueFrom":{"fieldRef":{"fieldPath":"status.podIP"}}}]}]}}' >/dev/null
$kubectl wait --for=condition=Ready pod/hello --timeout=60s >/dev/null
ip=$($kubectl get pod hello -o jsonpath='{.status.podIP}')
for _ in $(seq 50); do curl -fs "http://$ip:8080/" >/dev/null && break; sleep 0.2; done
echo "pod hello is at $ip; GET http://$ip:8080/ -> $(curl -s -o /dev/null -w '%{http_code}' "http://$ip:8080/")"
echo
echo "== stopping"

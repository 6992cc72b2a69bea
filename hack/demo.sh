#!/usr/bin/env bash
# The second half of `make demo`: shoal as a user meets it, on the testbed (a
# real Kubernetes control plane with fake GPU nodes; engine pods run the
# simulator at their pod IPs). helm install, kubectl apply a VLLMCluster,
# kubectl get vllmclusters, requests through the router, then clean up.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/hack"
py=.venv/bin/python
dir="$(mktemp -d /tmp/shoal-demo.XXXXXX)"
trap '$py -m shoal_testbed down --dir "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "starting the testbed (etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes)"
# Without the real node (kubelet + containerd): the fleet runs on the kwok GPU
# nodes, and `make demo` builds only the control plane (no image, no containerd).
SHOAL_TESTBED_NODE=0 $py -m shoal_testbed up --dir "$dir" | tail -1
export KUBECONFIG="$dir/kubeconfig"
kubectl() { .testbed/bin/kubectl "$@"; }
helm() { .testbed/bin/helm "$@"; }
kubectl get nodes -o custom-columns='NODE:.metadata.name,GPUS:.status.allocatable.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product'

step "helm install shoal charts/shoal"
kubectl create namespace demo >/dev/null
helm install shoal charts/shoal --namespace shoal-system --create-namespace \
  --set 'operator.watchNamespaces={demo}' --wait --timeout 180s | sed -n '1,6p'
helm test shoal --namespace shoal-system --timeout 120s | grep -E '^(TEST SUITE|Phase)' | head -2

step "kubectl apply -f hack/demo-fleet.yaml   (Llama-3.1-8B, 3 replicas, warm-up prompts)"
kubectl apply -n demo -f hack/demo-fleet.yaml
kubectl wait -n demo vllmcluster/demo --for=condition=Ready --timeout=240s >/dev/null
kubectl get vllmclusters -n demo
kubectl get pods -n demo -o wide | awk '{print $1, $2, $3, $6, $7}' | column -t

step "requests through the router (pod IP, as the Service would route them)"
router=$(kubectl get pods -n demo -l app.kubernetes.io/component=router \
  -o jsonpath='{.items[0].status.podIP}')
for _ in $(seq 100); do curl -sf "http://$router:8000/ready" >/dev/null && break; sleep 0.2; done
system="You are the support assistant of ACME Corp. Answer briefly, cite the manual section, never invent part numbers."
for i in $(seq 1 12); do
  tenant=$(( i % 3 ))
  curl -s -o /dev/null -D - "http://$router:8000/v1/chat/completions" \
    -H 'Content-Type: application/json' \
    -d "{\"model\": \"llama-8b\", \"max_tokens\": 8,
         \"messages\": [{\"role\": \"system\", \"content\": \"Tenant $tenant. $system\"},
                        {\"role\": \"user\", \"content\": \"Question $i?\"}]}" \
    | awk -v t="$tenant" '/^HTTP/ {code=$2} tolower($1) == "x-shoal-replica:" {r=$2} END {print "tenant " t " -> " (r ? r : "HTTP " code)}'
done | sort | uniq -c

step "kubectl scale vlc/demo --replicas=2 (drains the highest replica first)"
kubectl scale -n demo vlc/demo --replicas=2
kubectl wait -n demo vllmcluster/demo --for=jsonpath='{.status.replicas}'=2 --timeout=120s >/dev/null
kubectl get vllmclusters -n demo

step "cleaning up"
kubectl delete -n demo vllmcluster/demo --wait=true --timeout=60s
helm uninstall shoal --namespace shoal-system --wait >/dev/null

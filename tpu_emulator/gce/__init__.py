"""A Compute Engine API emulator for TPU VMs: instances, operations, instance templates, resource policies, managed
instance groups and their resize requests, served by the same process and port as the Cloud TPU API emulator for
the real google-cloud-compute client (REST transport). See docs/emulator.md and tpu_emulator.gce.emulator.

    client = compute_v1.InstancesClient(transport="rest", credentials=AnonymousCredentials(),
                                        client_options={"api_endpoint": emulator.endpoint})
"""

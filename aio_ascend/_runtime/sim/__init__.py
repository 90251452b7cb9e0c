"""The embedded simulator backend: an in-process model of the ACL runtime."""

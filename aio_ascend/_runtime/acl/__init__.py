"""_runtime/acl"""

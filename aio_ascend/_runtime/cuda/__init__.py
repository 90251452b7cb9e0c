"""_runtime/cuda"""

"""_host"""

"""_tools"""

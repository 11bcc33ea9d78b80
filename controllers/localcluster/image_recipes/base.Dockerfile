# The local python:<version>-slim: Debian's root filesystem from build_base.sh, and what the
# official image sets for a process to start with.
FROM scratch
ADD rootfs.tar /
ENV LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["python3"]

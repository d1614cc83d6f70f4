// SPDX-License-Identifier: GPL-2.0
/*
 * The inode whose address space holds every mapping of /dev/pcieipc, on a
 * pseudo filesystem of the module's own, as VFIO does for its devices
 * (drivers/vfio/vfio_main.c). A file of the device node is pointed at it at
 * open (f_mapping), so mappings can be zapped by file offset in every
 * process without holding the device node's inode, which may live on a
 * filesystem that is unmounted meanwhile.
 *
 * The filesystem is mounted once, at module load, and unmounted at unload.
 * Its type has no owner: a mounted type pins its owner, and this mount lives
 * as long as the module. Nothing can mount it by name (it is never
 * registered), and the unmount of an internal mount is synchronous, so no
 * callback into the module runs after pcieipc_mapping_inode_put.
 */
#include <linux/err.h>
#include <linux/fs.h>
#include <linux/mount.h>
#include <linux/pseudo_fs.h>

#define PCIEIPC_FS_MAGIC 0x70636965 /* "pcie" */

struct inode *pcieipc_mapping_inode_new(void);
void pcieipc_mapping_inode_put(struct inode *inode);

static struct vfsmount *pcieipc_mnt;

static int pcieipc_fs_init_fs_context(struct fs_context *fc)
{
	return init_pseudo(fc, PCIEIPC_FS_MAGIC) ? 0 : -ENOMEM;
}

static struct file_system_type pcieipc_fs_type = {
	.name = "pcieipc",
	.init_fs_context = pcieipc_fs_init_fs_context,
	.kill_sb = kill_anon_super,
};

/* Mounts the filesystem and returns a new inode on it, or an ERR_PTR. */
struct inode *pcieipc_mapping_inode_new(void)
{
	struct inode *inode;

	pcieipc_mnt = kern_mount(&pcieipc_fs_type);
	if (IS_ERR(pcieipc_mnt))
		return ERR_CAST(pcieipc_mnt);
	inode = alloc_anon_inode(pcieipc_mnt->mnt_sb);
	if (IS_ERR(inode))
		kern_unmount(pcieipc_mnt);
	return inode;
}

/* Releases the inode of pcieipc_mapping_inode_new and unmounts. */
void pcieipc_mapping_inode_put(struct inode *inode)
{
	iput(inode);
	kern_unmount(pcieipc_mnt);
}
